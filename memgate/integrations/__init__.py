"""Adapters that let agent frameworks keep their memory in memgate, each behind an extra.

`memgate.integrations.langgraph.MemgateStore` (`pip install 'memgate[langgraph]'`) is imported
from its own module, so that this package loads without any framework installed.
"""

__all__: list[str] = []
