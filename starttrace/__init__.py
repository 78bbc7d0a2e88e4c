"""starttrace: where the startup time of multi-process Python servers goes.

Importing this package must stay cheap: the `.pth` hook imports it in every traced process.
"""

__version__ = "0.1.0"
