"""Implementations chosen by name from a config string (big_vision / Tunix style).

One `Registry` per kind of choice: fatal modes and fatal indices (`rl.fatal`), advantage estimators
(`rl.advantages`), loss aggregations (`rl.losses`), judges (`judges.registry`).

  ESTIMATORS = registry.Registry('advantage estimator')

  @ESTIMATORS.register('grpo')
  def grpo_normalized(rewards, *, delta, std_ddof): ...

  fn = ESTIMATORS.get(config.grpo.estimator)   # ValueError naming the kind and the known names
"""

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar('T')


class Registry(Generic[T]):
  """A name -> entry table of one kind; entries are registered once, at import.

  Args:
    kind: what the names choose, as error messages say it (e.g. 'fatal_mode', 'judge').
  """

  def __init__(self, kind: str):
    self.kind = kind
    self._entries: dict[str, T] = {}

  def register(self, name: str) -> Callable[[T], T]:
    """Decorator storing its argument under `name` and returning it unchanged.

    Also usable as a call on a value: `REGISTRY.register('name')(value)`.

    Raises:
      ValueError: (when applied) `name` is already registered.
    """
    def decorator(entry: T) -> T:
      if name in self._entries:
        raise ValueError(f'{self.kind} {name!r} is already registered')
      self._entries[name] = entry
      return entry
    return decorator

  def get(self, name: str) -> T:
    """The entry registered as `name`.

    Raises:
      ValueError: `name` is not registered; the message names the kind and the registered names.
    """
    if name not in self._entries:
      raise ValueError(f'{self.kind} {name!r} is not one of {self.names()}')
    return self._entries[name]

  def names(self) -> list[str]:
    """The registered names, sorted."""
    return sorted(self._entries)

  def __contains__(self, name: object) -> bool:
    return name in self._entries

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def __repr__(self) -> str:
    return f'Registry({self.kind!r}, {self.names()})'
