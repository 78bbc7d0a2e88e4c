"""The hot path: the code that runs inside every traced process (standard library only).

`starttrace.pth` -> boot -> recorder -> journal, and the probes (probes/). Nothing here imports
starttrace from outside this folder (tests/unit/test_layers.py); the package import stays cheap:
the `.pth` line imports it in every traced process.
"""
