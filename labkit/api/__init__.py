"""The Python API for notebook cells: `labkit.run`, `labkit.stage`, `labkit.runs`, `labkit.compare`.

`labkit/__init__.py` reaches these modules only when one of the names is used (module `__getattr__`), so `import
labkit` stays cheap; each module loads what its calls need: `labkit.runs()` reads the registry without torch.
The layer sits above the command line (`labkit.cli`), whose runner `labkit.run` uses. Documented in docs/python-api.md.
"""
