"""Named extensions of one kind, the built-in one first, the others found through an entry-point group.

The retrieval representations (``retrieval/representations.py``) and the export's
representation writers (``hf/representation.py``) are such registries: DupMAE adds
one of each without ``retrieval`` or ``hf`` importing it.  An extension registers
itself with :meth:`Extensions.register` when its module is imported; a lookup of a
name the registry does not know, or a question about every extension, first loads
the group's entry points (``setup.py``; each names an object of the registry's kind).
"""

from importlib.metadata import entry_points
from typing import Dict, Generic, List, Optional, Tuple, Type, TypeVar

T = TypeVar("T")


class Extensions(Generic[T]):
    def __init__(self, group: str, kind: Type[T], built_in: str):
        self.group, self.kind, self.built_in = group, kind, built_in
        self._by_name: Dict[str, T] = {}
        self._discovered = False

    def register(self, extension: T) -> T:
        """Add ``extension`` under its ``name`` (again: replaced); returns it."""
        self._by_name[extension.name] = extension
        return extension

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        for ep in sorted(entry_points(group=self.group), key=lambda e: e.name):
            found = ep.load()
            if isinstance(found, self.kind):
                self.register(found)

    def names(self) -> Tuple[str, ...]:
        """Every name, the built-in one first (a ``--representation``'s choices)."""
        self._discover()
        return (self.built_in, *sorted(n for n in self._by_name if n != self.built_in))

    def find(self, name: str) -> Optional[T]:
        if name not in self._by_name:
            self._discover()
        return self._by_name.get(name)

    def others(self) -> List[T]:
        """Every extension but the built-in one, by name."""
        self._discover()
        return [e for n, e in sorted(self._by_name.items()) if n != self.built_in]
