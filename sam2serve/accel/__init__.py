"""Execution modes (baseline, fast, furious) and ahead-of-time artifacts."""
