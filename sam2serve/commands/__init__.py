"""The ``sam2serve`` subcommands, one module each; :mod:`sam2serve.cli` dispatches.

- :mod:`common`     what every command shares: program name, exit codes, the parser and
                    help formatter, error lines, the flags several commands take
- :mod:`model`      the model a command asks for: RuntimeSpec from the flags, the
                    predictor, device / checkpoint / artifacts errors as usage errors
- :mod:`amg_flags`  the AMG flags of ``run`` and ``bench``
- :mod:`inputs`     ``run``'s images and prompts, checked before the model loads
- :mod:`run`, :mod:`annotate`, :mod:`bench`, :mod:`export`, :mod:`download`, :mod:`serve`,
  :mod:`loadtest`, :mod:`cluster`: one per subcommand, each with ``register(subcommands)``

Every module is torch-free at import; handlers import what they run.
"""
