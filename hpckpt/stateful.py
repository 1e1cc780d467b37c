"""What :meth:`hpckpt.Checkpointer.save` and :meth:`~hpckpt.Checkpointer.restore` take in
place of a tree: an object that says itself what to save and where restored values go.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .protocols.restore import Restored


@runtime_checkable
class Stateful(Protocol):
    """What :meth:`hpckpt.Checkpointer.save` and :meth:`~hpckpt.Checkpointer.restore` take
    in place of a tree (:class:`hpckpt.torch.TrainingState` is one).

    ``checkpoint_tree()`` gives the tree to save, over the live arrays;
    ``checkpoint_tree(for_restore=True)`` the tree to restore into. The restore is not
    strict (leaves of only the tree or only the step are left alone): it then calls
    ``load_checkpoint_tree(tree, restored)``, alike on every rank, which puts the
    restored values where they belong and raises
    :class:`~hpckpt.errors.StateMismatchError` for what it cannot do without.
    """

    def checkpoint_tree(self, *, for_restore: bool = False) -> dict[str, Any]:
        """The tree to save (or with ``for_restore``, to restore into). Called on every rank."""
        ...

    def load_checkpoint_tree(self, tree: dict[str, Any], restored: Restored) -> None:
        """Put the values restored into ``tree`` where they belong. Called on every rank alike."""
        ...
