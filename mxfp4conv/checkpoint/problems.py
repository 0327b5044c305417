"""Problems found while reading a checkpoint, collected instead of raised (for ``inspect``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from mxfp4conv.errors import CheckpointError


@dataclass(frozen=True)
class Problem:
    severity: str  # "error" | "warning"
    message: str

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Problems:
    """A list of problems; ``strict`` turns the first error into a ``CheckpointError``."""

    strict: bool = False
    items: list[Problem] = field(default_factory=list)

    def error(self, message: str) -> None:
        if self.strict:
            raise CheckpointError(message)
        self.items.append(Problem("error", message))

    def warning(self, message: str) -> None:
        self.items.append(Problem("warning", message))

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.items if p.severity == "error"]

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)
