"""Learning-rate schedulers: ``LRScheduler`` and the ``StepLR`` / ``LambdaLR`` schedules.

A scheduler owns the ``"lr"`` of each parameter group of one optimizer. At construction it
records ``initial_lr`` in every group (unless resuming with ``last_epoch >= 0``) and takes the
first step, so ``group["lr"]`` holds the epoch-0 rate; each ``step()`` then moves one epoch.
As in PyTorch, call ``optimizer.step()`` before ``scheduler.step()`` in each epoch.
"""

from __future__ import annotations

import types
import warnings
from typing import Any, Callable, Sequence

from .optimizer import Optimizer

__all__ = ["LRScheduler", "StepLR", "LambdaLR"]


class LRScheduler:
    """Base of the schedulers: subclasses implement ``get_lr()`` (the rates for
    ``self.last_epoch``, from the current ``group["lr"]`` values or from ``base_lrs``) and may
    implement ``_get_closed_form_lr()`` for ``step(epoch)``.

    Args:
        optimizer: the optimizer whose learning rates are scheduled.
        last_epoch: the index of the last epoch; -1 starts a new schedule, a value >= 0
            resumes one (every group must then hold ``initial_lr``).

    Raises:
        TypeError: ``optimizer`` is not a ``gradwire.optim.Optimizer``.
        KeyError: resuming (``last_epoch >= 0``) with a group that has no ``initial_lr``.
    """

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(
                        f"param 'initial_lr' is not specified in param_groups[{i}] when "
                        "resuming an optimizer (pass last_epoch=-1 to start a new schedule)"
                    )
        self.base_lrs: list[float] = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._step_count = 0
        self._last_lr: list[float] = []
        self.step()

    def get_lr(self) -> list[float]:
        """The learning rates of every group for epoch ``self.last_epoch``."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_lr")

    def get_last_lr(self) -> list[float]:
        """The learning rates of every group set by the last ``step()``.

        Returns:
            One float per parameter group.
        """
        return list(self._last_lr)

    def step(self, epoch: int | None = None) -> None:
        """Advance one epoch (or, deprecated as in PyTorch, jump to ``epoch``) and write the
        new rate into every parameter group.

        Args:
            epoch: deprecated; the epoch to jump to.
        """
        self._step_count += 1
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            warnings.warn(
                "The epoch parameter in `scheduler.step()` is deprecated; call "
                "`scheduler.step()` once per epoch instead.",
                UserWarning,
                stacklevel=2,
            )
            self.last_epoch = epoch
            closed = getattr(self, "_get_closed_form_lr", None)
            values = closed() if closed is not None else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Everything but the optimizer (its state has its own ``state_dict``).

        Returns:
            A dict of the scheduler's attributes.
        """
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Args:
            state_dict: a dict from :meth:`state_dict`.
        """
        self.__dict__.update(state_dict)


class StepLR(LRScheduler):
    """Multiply each group's rate by ``gamma`` every ``step_size`` epochs.

    ``lr = initial_lr * gamma ** (epoch // step_size)`` (applied multiplicatively, so it
    composes with other changes of ``group["lr"]``, as in PyTorch).

    Args:
        optimizer: the optimizer whose learning rates are scheduled.
        step_size: period of the decay, in epochs.
        gamma: multiplicative factor of the decay.
        last_epoch: the index of the last epoch (-1: start).

    Raises:
        ValueError: ``step_size`` is not a positive integer.

    Example:
        >>> sched = gradwire.optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.1)
        >>> for epoch in range(100):
        ...     train(...); sched.step()
    """

    def __init__(
        self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1
    ) -> None:
        if isinstance(step_size, bool) or not isinstance(step_size, int) or step_size <= 0:
            raise ValueError(f"step_size must be a positive integer, got {step_size!r}")
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """The rates for ``self.last_epoch``: decayed by ``gamma`` on multiples of step_size."""
        groups = self.optimizer.param_groups
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return [group["lr"] for group in groups]
        return [group["lr"] * self.gamma for group in groups]

    def _get_closed_form_lr(self) -> list[float]:
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class LambdaLR(LRScheduler):
    """Set each group's rate to ``initial_lr * lr_lambda(epoch)``.

    Args:
        optimizer: the optimizer whose learning rates are scheduled.
        lr_lambda: a function of the epoch, or a list of them, one per parameter group.
        last_epoch: the index of the last epoch (-1: start).

    Raises:
        ValueError: a list of ``lr_lambda`` whose length is not the number of groups.

    Example:
        >>> sched = gradwire.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 0.95**epoch)
    """

    def __init__(
        self,
        optimizer: Optimizer,
        lr_lambda: Callable[[int], float] | Sequence[Callable[[int], float]],
        last_epoch: int = -1,
    ) -> None:
        n = len(optimizer.param_groups) if isinstance(optimizer, Optimizer) else 0
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != n:
                raise ValueError(f"Expected {n} lr_lambdas, but got {len(lr_lambda)}")
            self.lr_lambdas: list[Callable[[int], float]] = list(lr_lambda)
        else:
            if not callable(lr_lambda):
                raise TypeError(
                    f"lr_lambda must be a function of the epoch (or a list of them), "
                    f"got {type(lr_lambda).__name__}"
                )
            self.lr_lambdas = [lr_lambda] * n
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        """The rates for ``self.last_epoch``: ``base_lr * lr_lambda(last_epoch)``."""
        return [base * f(self.last_epoch) for f, base in zip(self.lr_lambdas, self.base_lrs)]

    def state_dict(self) -> dict[str, Any]:
        """As :meth:`LRScheduler.state_dict`; of each ``lr_lambda`` only a callable object's
        ``__dict__`` is kept (plain functions and lambdas are not saved: None)."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [
            None
            if isinstance(f, (types.FunctionType, types.BuiltinFunctionType, types.MethodType))
            else dict(getattr(f, "__dict__", {}))
            for f in self.lr_lambdas
        ]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (callable objects get their saved
        ``__dict__`` back; the functions themselves stay those given to the constructor)."""
        state = dict(state_dict)
        saved = state.pop("lr_lambdas", None)
        self.__dict__.update(state)
        if saved is not None:
            for f, attrs in zip(self.lr_lambdas, saved):
                if attrs is not None:
                    f.__dict__.update(attrs)
