"""How long a step takes, learned from the steps that ran: what the scheduler needs to size a prefill chunk so
that the streams decoding beside it are not held up much longer than their usual cadence.

A step costs a fixed part (the weights stream from memory once per step, whatever the batch; the thread pool's
start and end), a part per decode row, and a part per prompt token (the matmuls are compute-bound at these
batch sizes, so that part grows with the rows). The three are fitted by least squares over recent steps, each
weighted by how recent it is (the machine's speed drifts: other processes, memory bandwidth phases). Every kind
of step informs the fit: prefill-only steps the per-token cost, decode-only steps the decode cost at their number
of rows, mixed steps both. What the steps seen cannot tell apart (the first few steps of a server: one prompt,
then decodes of one size) is settled by what is true of the matmuls: a decode row costs about what a prompt token
costs (the same rows through the same weights, plus its logits), so the fit leans, faintly, towards the two being
equal; steps that do tell them apart outweigh that at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field


FORGET = 0.95  # weight of a step relative to the one after it
PRIOR = 1e-6  # pull towards "a decode row costs what a prompt token costs", relative to the data's own weight
RIDGE = 1e-12  # keeps the system solvable, relative to the weighted sum of squares of each feature
MIN_STEPS = 3  # steps seen before the fit is used


@dataclass
class StepCost:
    # exponentially weighted sums of x x^T and x y, with x = (1, decode rows, prompt tokens) and y the step's seconds
    _xx: list[list[float]] = field(default_factory=lambda: [[0.0] * 3 for _ in range(3)])
    _xy: list[float] = field(default_factory=lambda: [0.0] * 3)
    _coef: tuple[float, float, float] | None = None  # (fixed, per decode row, per prompt token) seconds
    num_steps: int = 0  # steps seen

    def observe(self, duration_s: float, num_decode_rows: int, num_prompt_tokens: int) -> None:
        x = (1.0, float(num_decode_rows), float(num_prompt_tokens))
        for i in range(3):
            self._xy[i] = FORGET * self._xy[i] + x[i] * duration_s
            for j in range(3):
                self._xx[i][j] = FORGET * self._xx[i][j] + x[i] * x[j]
        self.num_steps += 1
        fit = self._fit() if self.num_steps >= MIN_STEPS else None
        if fit is not None:  # steps that say nothing consistent (a burst of noise) leave the last costs standing
            self._coef = fit

    @property
    def known(self) -> bool:
        return self._coef is not None

    def decode_s(self, num_decode_rows: int) -> float | None:
        """A step of `num_decode_rows` decodes alone, as the fit predicts it (None until it is known)."""
        if self._coef is None:
            return None
        fixed, per_row, _ = self._coef
        return fixed + per_row * num_decode_rows

    @property
    def per_prompt_token_s(self) -> float | None:
        return None if self._coef is None else self._coef[2]

    def prompt_tokens_within(self, budget_s: float, num_decode_rows: int, floor: int) -> int | None:
        """Prompt tokens a step with `num_decode_rows` decodes may take and still end within `budget_s`; never
        fewer than `floor` (a prompt must always progress). None until the costs are known."""
        decode_s, per_token = self.decode_s(num_decode_rows), self.per_prompt_token_s
        if decode_s is None or per_token is None:
            return None
        return max(floor, int((budget_s - decode_s) / per_token + 1e-3))  # the fit's rounding: 30.9999 is 31

    def _fit(self) -> tuple[float, float, float] | None:
        """The costs, or None when the observations do not give a positive step cost and a positive token cost."""
        a = [row[:] + [self._xy[i]] for i, row in enumerate(self._xx)]
        for i in range(3):
            a[i][i] += RIDGE * max(a[i][i], 1.0)
        # PRIOR * scale * (per_row - per_token)^2 added to the squared error
        prior = PRIOR * max(min(self._xx[1][1], self._xx[2][2]), 1.0)
        a[1][1] += prior
        a[2][2] += prior
        a[1][2] -= prior
        a[2][1] -= prior
        coef = _solve(a)
        if coef is not None and coef[2] > 0 and min(coef[0], coef[1]) < 0:
            # Noise or steps of nearly one decode size (a closed-loop load: 8 rows, now and then 7 beside a new
            # prompt) can put the fixed part or the per-row part below zero and the other one far above what any
            # step took. Clamping the negative one to zero would keep the inflated one (a decode step predicted
            # at twice what it takes, so prompt chunks twice too long); refit without it instead.
            kept = (1, 2) if coef[0] < coef[1] else (0, 2)  # the part left beside the prompt tokens' cost
            sub = _solve([[a[i][j] for j in kept] + [a[i][3]] for i in kept])
            coef = None if sub is None else ((0.0, sub[0]) if kept[0] == 1 else (sub[0], 0.0)) + (sub[1],)
        if coef is None or coef[2] <= 0 or coef[0] < 0 or coef[1] < 0 or coef[0] + coef[1] <= 0:
            return None
        fixed, per_row, per_token = coef
        return fixed, per_row, per_token


def _solve(a: list[list[float]]) -> tuple[float, ...] | None:
    """The solution of the augmented n x (n + 1) system `a` (Gaussian elimination with partial pivoting: a 3 x 3
    system costs microseconds here, where numpy's call overhead took a sizeable part of a small model's step), None
    when it is singular."""
    m = [row[:] for row in a]
    n = len(m)
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if m[pivot][col] == 0.0:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return tuple(x)
