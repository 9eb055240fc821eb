"""The single source of truth for this build's version (pyproject.toml reads it).

``0.7.2+c1``: upstream leapp 0.7.2's API and YAML, in its first C-core build.  A
local version label keeps ``leapp==0.7.2`` requirements satisfied (PEP 440 ignores
the label when the specifier has none) while pip, ``leapp.__version__`` and the
YAML's ``leapp version`` tell this build apart; docs/installation.md has the
reasoning.
"""
__version__ = "0.7.2+c1"
__implementation__ = "c"
