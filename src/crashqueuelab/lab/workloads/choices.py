"""A random source whose every draw is data: recorded block by block while a seeded run
makes its choices, and replayed from those blocks, edited or not, to make them again.

A shrinker deletes blocks (one block is one operation of a workload) and reruns the tape;
the operations left still draw their own recorded values, in a state the deleted ones no
longer shaped, which is what makes a deletion a smaller run and not a different one. A
block that asks for more draws than it holds gets zeros (the first choice, the smallest
number): the rule Hypothesis uses for a shortened choice sequence, and what keeps every
edited tape a valid run. Every draw is an integer, so a tape is plain JSON.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

#: ``random()`` draws 53 bits, as the Mersenne Twister's float does.
_FLOAT_BITS = 53


class ChoiceTape(random.Random):
    """Records (given ``blocks`` None) or replays (given ``blocks``) every draw.

    ``used`` holds, block by block, the draws the run actually consumed: in replay that is
    the edited tape in its canonical form (missing draws as the zeros they became, unused
    ones gone)."""

    def __init__(self, seed: int, blocks: Sequence[Sequence[int]] | None = None) -> None:
        self._recorded = None if blocks is None else [list(block) for block in blocks]
        self._block = -1
        self._position = 0
        self.used: list[list[int]] = [[]]
        super().__init__(seed)

    @property
    def replaying(self) -> bool:
        return self._recorded is not None

    def next_block(self) -> None:
        """The draws that follow belong to the next block (the next operation)."""
        self._block += 1
        self._position = 0
        self.used.append([])

    def _draw(self, bits: int) -> int:
        if self._recorded is None:
            value = super().getrandbits(bits) if bits else 0
        else:
            block = self._recorded[self._block + 1] if self._block + 1 < len(self._recorded) else []
            recorded = block[self._position] if self._position < len(block) else 0
            value = recorded & ((1 << bits) - 1)
        self._position += 1
        self.used[-1].append(value)
        return value

    def random(self) -> float:
        return self._draw(_FLOAT_BITS) / (1 << _FLOAT_BITS)

    def getrandbits(self, k: int) -> int:
        return self._draw(k)
