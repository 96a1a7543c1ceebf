"""A backend in one module, for tests/runtime/test_spec.py: eager, plus a note of its use."""

from sam2serve.runtime.backends.eager import Eager

BUILT: list[str] = []


class Example(Eager):
    def build_from_model(self, spec, model):
        BUILT.append(spec.label)
        return super().build_from_model(spec, model)


BACKEND = Example()
