"""The operator of a chaos run under pause: a script of moves, drawn with the schedule.

A run under `--on-rank-loss pause` waits at its desk (scheduler/operator.py) after each loss.
In chaos nobody is at a terminal: a `ScriptedOperator` answers instead, one move per pause,
in the order drawn. A move is an instruction and a twist:

- `retry`, `scale-down`, `scale-up`, `abort`: what it says;
- `:late` it answers after a while (the run stays paused meanwhile);
- `:twice` it sends the same id twice: the desk must give the same answer both times;
- `:stale` it first sends the instruction for the epoch before: the desk must refuse it (409);
- `never`: it does not answer: the pause timeout applies the schedule's default.

Moves past the last are `never`. What the desk answers against its own rules is a problem
(the run's break, of class "operator"); an instruction refused because it cannot be carried
out now (scale-down below the floor, scale-up at the size asked for) is no problem: the run
stays paused and the next move answers the same pause.
"""
from __future__ import annotations

import random
import threading
import time

INSTRUCTIONS = ("retry", "scale-down", "scale-up", "abort")
WEIGHTS = (5, 3, 1, 1)
TWISTS = ("", "late", "twice", "stale")
TWIST_WEIGHTS = (4, 1, 2, 2)
NEVER = "never"
NEVER_WEIGHT = 0.1
DEFAULTS = ("abort", "retry", "scale-down")     # what the pause timeout may apply
PAUSE_TIMEOUT_S = 0.4          # a chaos run's pause timeout: what a `never` costs
LATE_S = 0.1                   # how late a `late` answer comes
WAIT_S = 30.0                  # the longest the operator waits for the next pause


def draw_operator(rng: random.Random, pauses: int) -> tuple[tuple[str, ...], str]:
    """`pauses` moves (one per pause the faults may cause, and one more) and the timeout's default."""
    moves = []
    for _ in range(pauses + 1):
        if rng.random() < NEVER_WEIGHT:
            moves.append(NEVER)
            continue
        move = rng.choices(INSTRUCTIONS, WEIGHTS)[0]
        twist = rng.choices(TWISTS, TWIST_WEIGHTS)[0]
        moves.append(f"{move}:{twist}" if twist else move)
    return tuple(moves), rng.choice(DEFAULTS)


class ScriptedOperator:
    """Answers a desk's pauses by `moves`, on a thread of its own, until `stop()`."""

    def __init__(self, desk, moves: tuple[str, ...]):
        self.desk = desk
        self.moves = list(moves)
        self.problems: list[str] = []
        self.answered: list[tuple[str, int]] = []     # (move, the desk's code), in order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-operator", daemon=True)

    def start(self) -> "ScriptedOperator":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self.desk.changed:
            self.desk.changed.notify_all()
        self._thread.join(timeout=5)

    def _paused(self, handled: tuple) -> dict | None:
        """The desk's status once it is paused at a pause not answered yet (None: stopped)."""
        desk = self.desk
        deadline = time.monotonic() + WAIT_S
        with desk.changed:
            while not self._stop.is_set():
                status = dict(desk.status)
                if status.get("phase") == "paused" and (status.get("epoch"), status.get("step")) != handled:
                    return status
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                desk.changed.wait(min(left, 0.5))
        return None

    def _run(self) -> None:
        handled: tuple = (None, None)
        for i, move in enumerate(self.moves):
            status = self._paused(handled)
            if status is None:
                return
            epoch = status["epoch"]
            if move == NEVER:
                handled = (epoch, status["step"])         # the timeout answers this one
                continue
            instruction, _, twist = move.partition(":")
            if twist == "late" and self._stop.wait(LATE_S):
                return
            if twist == "stale":
                code, body = self.desk.apply(f"op-{i}-stale", instruction, epoch - 1)
                if code != 409:
                    self.problems.append(f"an instruction for epoch {epoch - 1} while paused in epoch "
                                         f"{epoch} got {code} {body}, not 409")
            code, body = self.desk.apply(f"op-{i}", instruction, epoch)
            self.answered.append((move, code))
            if twist == "twice":
                again = self.desk.apply(f"op-{i}", instruction, epoch)
                if again != (code, body):
                    self.problems.append(f"the same id applied twice got {code} {body}, then {again[0]} "
                                         f"{again[1]}")
            if code == 409 and instruction in status.get("can", ()):
                self.problems.append(f"{instruction}, which the status says can be done, was refused: {body}")
            if code not in (200, 409):
                self.problems.append(f"{instruction} got {code} {body}")
            if code == 200:
                handled = (epoch, status["step"])
