"""The live requests of a scheduler and how each one ends: waiting in arrival order, running, preempted back to
the front of the queue; finished by a token-level stop, a stop string, an abort, a timeout or an error, with
their blocks freed before the client can see the end. The scheduling policy (scheduler.py) builds on it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from inferd.engine.kv_cache import KVCacheManager
from inferd.engine.request import FinishReason, RequestOutput, RequestState
from inferd.engine.types import RequestStatus


class Sequences:
    def __init__(self, kv: KVCacheManager, clock: Callable[[], float]):
        self.kv = kv
        self.clock = clock
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.requests: dict[str, RequestState] = {}  # every unfinished request, by id
        self.num_preemptions = 0
        self._outputs: list[tuple[RequestState, RequestOutput]] = []

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def take_outputs(self) -> list[tuple[RequestState, RequestOutput]]:
        """What each request should be told since the last call, in order."""
        outputs, self._outputs = self._outputs, []
        return outputs

    # ---- preemption ----------------------------------------------------------------------------------

    def _release_waiting(self) -> bool:
        """Drop the prefix-cache hits that waiting sequences hold (matched at the head of the queue, then not
        admitted for want of room); they match again when admitted. Cheaper than preempting a running
        sequence, and a sequence running alone must never be failed for blocks that waiting ones hold."""
        released = False
        for w in self.waiting:
            if self.kv.has_seq(w.key):
                self.kv.free(w.key)
                w.num_computed = 0
                released = True
        return released

    def _preempt(self, st: RequestState) -> None:
        # Recompute later: drop the blocks (full ones stay in the prefix cache, so the recompute is mostly
        # a cache hit), keep the generated tokens, go back to the front of the queue.
        self.running.remove(st)
        self.kv.free(st.key)
        st.num_computed = 0
        if st.status.prompt_done:
            st.status = RequestStatus.PREEMPTED
        else:
            st.status = RequestStatus.WAITING
            st.prompt_logprobs.clear()  # collected again, from position 1, by the recompute
        st.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(st)

    # ---- ends ----------------------------------------------------------------------------------------

    def abort(self, request_id: str) -> RequestState | None:
        """Finish a request (the client went away); None if it has finished already."""
        st = self.requests.get(request_id)
        if st is not None:
            self._finish(st, FinishReason.ABORT)
        return st

    def expire_timeouts(self) -> list[RequestState]:
        now = self.clock()
        expired = [
            st
            for st in list(self.running) + list(self.waiting)
            if st.request.timeout_s is not None and now - st.arrival_time > st.request.timeout_s
        ]
        for st in expired:
            self._finish(st, FinishReason.ERROR, f"request timed out after {st.request.timeout_s:g} s", status=504)
        return expired

    def abort_all(self, reason: FinishReason, message: str, status: int) -> list[RequestState]:
        states = list(self.requests.values())
        for st in states:
            self._finish(st, reason, message, status=status)
        return states

    def finish_at_stop_string(self, st: RequestState, num_output_tokens: int) -> None:
        """The output processor found a stop string ending at generated token `num_output_tokens`: the sequence
        ends there (it may have finished in the same step already), and tokens after it do not count."""
        extra = len(st.output_ids) - num_output_tokens
        if extra > 0:
            del st.output_ids[num_output_tokens:]
            del st.token_ids[len(st.token_ids) - extra :]
        self._finish(st, FinishReason.STOP, deliver=False)
        st.finish_reason = FinishReason.STOP  # also over a reason the step's later tokens gave

    def _finish(
        self,
        st: RequestState,
        reason: FinishReason,
        message: str | None = None,
        *,
        status: int = 500,
        deliver: bool = True,
    ) -> None:
        if st.status is RequestStatus.FINISHED:
            return
        if st in self.running:
            self.running.remove(st)
        elif st in self.waiting:
            self.waiting.remove(st)
        st.status = RequestStatus.FINISHED
        st.finish_reason = reason
        st.finish_time = self.clock()
        self.kv.free(st.key)
        self.requests.pop(st.request.request_id, None)
        if deliver:
            output = RequestOutput(
                request_id=st.request.request_id,
                finish_reason=reason,
                error_message=message,
                error_status=status if reason == FinishReason.ERROR else None,
                prompt_logprobs=st.take_prompt_logprobs(),
                usage=st.usage(),
            )
            self._outputs.append((st, output))
