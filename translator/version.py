"""The translator's version (saved with each translated model, translator.frontends.serialize)."""

__version__ = "0.1.0"
