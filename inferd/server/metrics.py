"""Prometheus metrics: vLLM-compatible names under the `inferd:` prefix, label `model_name`, plus ours; and the
scheduler-state names under vLLM's own `vllm:` prefix, the ones routing layers read by default (Gateway API
Inference Extension's endpoint picker, llm-d, vLLM's production-stack router, KEDA triggers; docs/operations.md).

Event metrics (tokens, latencies, finished requests) are updated from the scheduler thread through the
Observer interface; state metrics (queue lengths, KV usage, throughput, bandwidth) are read from the
scheduler when /metrics is scraped. No metric carries prompt or completion text, only counts and times.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING
from collections.abc import Sequence

import prometheus_client
import prometheus_client.exposition
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from inferd.engine.request import FinishReason, RequestState
from inferd.engine.scheduler import StepStats

if TYPE_CHECKING:
    from inferd.engine.loop import EngineLoop
    from inferd.engine.prompt_cache_disk import DiskPromptCache

# *_created series double the output and no dashboard uses them (vLLM turns them off too).
prometheus_client.disable_created_metrics()

# The classic text format: every name here is valid in it, and every Prometheus version reads it.
CONTENT_TYPE = getattr(prometheus_client.exposition, "CONTENT_TYPE_PLAIN_0_0_4", prometheus_client.CONTENT_TYPE_LATEST)
P = "inferd:"
VLLM = "vllm:"

TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
ITL_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]

WINDOW_S = 10.0  # throughput and bandwidth gauges average the steps of the last WINDOW_S seconds


class Metrics:
    """Implements the scheduler's Observer; `render()` produces the /metrics body."""

    def __init__(self, model_name: str, read_bandwidth: float = 0.0, disk_cache: DiskPromptCache | None = None):
        self.model_name = model_name
        self.read_bandwidth = read_bandwidth
        self.disk_cache = disk_cache
        self.registry = CollectorRegistry()
        self.engine_loop: EngineLoop | None = None
        self._base = (0, 0, 0)
        self._lock = threading.Lock()
        self._window: deque[tuple[float, int, int, float, int]] = deque()
        self._started = time.monotonic()
        r, m = self.registry, ["model_name"]

        def counter(name, doc, labels=m):
            return Counter(P + name, doc, labels, registry=r)

        def histogram(name, doc, buckets):
            return Histogram(P + name, doc, m, buckets=buckets, registry=r)

        # the families by model_name: an embedding model served beside this one counts its requests in them too
        self.prompt_tokens_family = counter("prompt_tokens", "Prompt tokens of requests whose prefill finished.")
        self.prompt_tokens = self.prompt_tokens_family.labels(model_name)
        self.generation_tokens = counter("generation_tokens", "Generated tokens.").labels(model_name)
        self.request_success = counter(
            "request_success", "Finished requests by finish reason.", ["model_name", "finished_reason"]
        )
        self.spec_draft_tokens = counter(
            "spec_decode_num_draft_tokens", "Speculative (prompt-lookup) tokens proposed and verified."
        ).labels(model_name)
        self.spec_accepted_tokens = counter(
            "spec_decode_num_accepted_tokens", "Speculative tokens the model agreed with (kept)."
        ).labels(model_name)
        self.client_disconnected = counter(
            "http_requests_client_disconnected", "Requests whose client went away before the response ended."
        ).labels(model_name)
        self.ttft = histogram("time_to_first_token_seconds", "Arrival to first generated token.", TTFT_BUCKETS).labels(
            model_name
        )
        self.itl = histogram(
            "inter_token_latency_seconds", "Time between consecutive generated tokens.", ITL_BUCKETS
        ).labels(model_name)
        self.e2e_family = histogram("e2e_request_latency_seconds", "Arrival to finish.", LATENCY_BUCKETS)
        self.queue_time_family = histogram(
            "request_queue_time_seconds", "Arrival to first scheduled step.", LATENCY_BUCKETS
        )
        self.e2e = self.e2e_family.labels(model_name)
        self.queue_time = self.queue_time_family.labels(model_name)
        self.registry.register(_StateCollector(self))
        for reason in FinishReason:  # present from the start, so rate() works on the first request
            self.request_success.labels(model_name, reason.value)

    def bind(self, engine_loop: EngineLoop) -> None:
        """Read state from `engine_loop` from now on; counters start at zero here (the start-up warm-up
        request is not traffic)."""
        kv = engine_loop.scheduler.kv.stats()
        self._base = (kv.prefix_queries, kv.prefix_hits, engine_loop.scheduler.num_preemptions)
        self.engine_loop = engine_loop

    # ---- Observer (scheduler thread) ------------------------------------------------------------------

    def on_step(self, stats: StepStats) -> None:
        if stats.prompt_tokens_done:
            self.prompt_tokens.inc(stats.prompt_tokens_done)
        if stats.num_decode_tokens:
            self.generation_tokens.inc(stats.num_decode_tokens)
        if stats.num_draft_tokens:
            self.spec_draft_tokens.inc(stats.num_draft_tokens)
            self.spec_accepted_tokens.inc(stats.num_accepted_tokens)
        for t in stats.ttfts:
            self.ttft.observe(t)
        for t in stats.itls:
            self.itl.observe(t)
        if stats.num_seqs:
            now = time.monotonic()
            with self._lock:
                self._window.append(
                    (now, stats.num_prefill_tokens, stats.num_decode_tokens, stats.duration_s, stats.bytes_read)
                )
                self._trim(now)

    def on_finished(self, states: Sequence[RequestState]) -> None:
        for st in states:
            reason = st.finish_reason.value if st.finish_reason is not None else FinishReason.ERROR.value
            self.request_success.labels(self.model_name, reason).inc()
            end = st.finish_time or time.monotonic()
            self.e2e.observe(end - st.arrival_time)
            if st.first_scheduled_time is not None:
                self.queue_time.observe(st.first_scheduled_time - st.arrival_time)

    # ---- HTTP side ---------------------------------------------------------------------------------------

    def on_client_disconnected(self) -> None:
        self.client_disconnected.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ---- windowed rates ----------------------------------------------------------------------------------

    def _trim(self, now: float) -> None:
        while self._window and self._window[0][0] < now - WINDOW_S:
            self._window.popleft()

    def rates(self) -> dict[str, float]:
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            steps = list(self._window)
        span = min(WINDOW_S, now - self._started) or 1.0
        busy = sum(s[3] for s in steps)
        bandwidth = sum(s[4] for s in steps) / busy if busy > 0 else 0.0
        return {
            "prefill_tokens_per_second": sum(s[1] for s in steps) / span,
            "decode_tokens_per_second": sum(s[2] for s in steps) / span,
            "memory_bandwidth_bytes_per_second": bandwidth,
            "memory_bandwidth_ratio": bandwidth / self.read_bandwidth if self.read_bandwidth else 0.0,
        }


class _StateCollector:
    """Values read from the scheduler at scrape time (no bookkeeping on the hot path)."""

    def __init__(self, metrics: Metrics):
        self.m = metrics

    def collect(self):
        m, labels = self.m, [self.m.model_name]

        def gauge(name, doc, value, prefix=P):
            g = GaugeMetricFamily(prefix + name, doc, labels=["model_name"])
            g.add_metric(labels, value)
            return g

        def counter(name, doc, value, prefix=P):
            c = CounterMetricFamily(prefix + name, doc, labels=["model_name"])
            c.add_metric(labels, value)
            return c

        s = m.engine_loop
        kv = s.scheduler.kv.stats() if s is not None else None
        yield gauge("num_requests_running", "Requests in the running batch.", s.num_running if s else 0)
        yield gauge("num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting if s else 0)
        yield gauge(
            "kv_cache_usage_perc",
            "Fraction of KV blocks referenced by live requests (1 = full).",
            kv.usage if kv else 0.0,
        )
        yield gauge("kv_cache_cached_blocks", "KV blocks holding a reusable prefix.", kv.num_cached if kv else 0)
        yield gauge("kv_cache_blocks", "KV blocks of 64 positions in the pool.", kv.num_blocks if kv else 0)
        if kv is not None and kv.num_state_slots:  # a model with recurrent layers
            yield gauge(
                "recurrent_state_slots", "Recurrent-state slots (one per running sequence).", kv.num_state_slots
            )
            yield gauge(
                "recurrent_state_slots_used",
                "Recurrent-state slots held by running sequences.",
                kv.num_state_slots_used,
            )
            yield gauge(
                "recurrent_state_snapshots",
                "Recurrent states kept at cached block boundaries for prefix-cache hits.",
                kv.num_state_snapshots,
            )
        base = m._base
        yield counter(
            "prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            kv.prefix_queries - base[0] if kv else 0,
        )
        yield counter(
            "prefix_cache_hits", "Prompt tokens found in the prefix cache.", kv.prefix_hits - base[1] if kv else 0
        )
        yield counter(
            "num_preemptions",
            "Sequences preempted (blocks freed, recomputed later).",
            s.scheduler.num_preemptions - base[2] if s else 0,
        )
        disk = m.disk_cache
        if disk is not None:
            yield counter(
                "prompt_cache_disk_hits",
                "Prompt tokens whose KV was read from the prompt cache on disk (of prefix_cache_hits).",
                kv.source_hits if kv else 0,
            )
            yield counter("prompt_cache_disk_read_bytes", "Bytes read from the prompt cache on disk.", disk.bytes_read)
            yield counter(
                "prompt_cache_disk_written_bytes", "Bytes written to the prompt cache on disk.", disk.bytes_written
            )
            yield counter(
                "prompt_cache_disk_skipped_files",
                "Prompt cache files not loaded (torn, truncated, corrupt, or of another model or KV format).",
                disk.files_skipped,
            )
        yield from self._vllm_names(gauge, counter, kv)
        rates = m.rates()
        yield gauge(
            "prefill_tokens_per_second",
            f"Prompt tokens computed per second over the last {WINDOW_S:g} s.",
            rates["prefill_tokens_per_second"],
        )
        yield gauge(
            "decode_tokens_per_second",
            f"Tokens generated per second over the last {WINDOW_S:g} s.",
            rates["decode_tokens_per_second"],
        )
        yield gauge(
            "memory_bandwidth_bytes_per_second",
            "Weight + KV bytes read per engine step over step time (recent steps).",
            rates["memory_bandwidth_bytes_per_second"],
        )
        yield gauge(
            "memory_bandwidth_ratio",
            "memory_bandwidth_bytes_per_second over the read bandwidth measured at start-up.",
            rates["memory_bandwidth_ratio"],
        )
        yield gauge(
            "measured_read_bandwidth_bytes_per_second",
            "RAM read bandwidth measured at start-up with numpy (0 if not measured).",
            m.read_bandwidth,
        )

    def _vllm_names(self, gauge, counter, kv):
        """The same scheduler state under the names and labels vLLM gives it (its v0 and v1 names both)."""
        m, s = self.m, self.m.engine_loop
        running, waiting = (s.num_running, s.num_waiting) if s else (0, 0)
        usage = kv.usage if kv else 0.0
        queries = kv.prefix_queries - m._base[0] if kv else 0
        hits = kv.prefix_hits - m._base[1] if kv else 0
        yield gauge("num_requests_running", "Number of requests in model execution batches.", running, VLLM)
        yield gauge("num_requests_waiting", "Number of requests waiting to be processed.", waiting, VLLM)
        yield gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage, VLLM)
        yield gauge("gpu_cache_usage_perc", "KV-cache usage (the older name). 1 means 100 percent usage.", usage, VLLM)
        for prefix in ("", "gpu_"):
            yield counter(f"{prefix}prefix_cache_queries", "Prefix cache queries, in tokens.", queries, VLLM)
            yield counter(f"{prefix}prefix_cache_hits", "Prefix cache hits, in tokens.", hits, VLLM)
        # vLLM v0's gauge, still read by its production-stack router
        rate = hits / queries if queries else 0.0
        yield gauge("gpu_prefix_cache_hit_rate", "Prefix cache hit rate since start (hits over queries).", rate, VLLM)
        config = {
            "block_size": str(s.scheduler.block_size if s else 64),
            "cache_dtype": str(getattr(s.engine, "kv_cache_dtype", "f16")) if s else "f16",
            "enable_prefix_caching": str(bool(s and s.scheduler.kv.enable_prefix_caching)),
            "num_gpu_blocks": str(kv.num_blocks if kv else 0),  # the KV pool, wherever it lives
            "num_cpu_blocks": "0",  # vLLM's swap space: none here
            "engine": "0",
            "model_name": m.model_name,  # beyond vLLM's labels: every series here names its model
        }
        info = GaugeMetricFamily(VLLM + "cache_config_info", "Information of the KV cache.", labels=list(config))
        info.add_metric(list(config.values()), 1.0)
        yield info
        # vLLM's LoRA gauge: adapter lists as labels, the value a timestamp so readers take the latest series
        lora = GaugeMetricFamily(
            VLLM + "lora_requests_info",
            "Running stats on lora requests.",
            labels=["running_lora_adapters", "max_lora", "waiting_lora_adapters", "model_name"],
        )
        running_names, waiting_names = adapters_in_use(s.scheduler) if s else ("", "")
        max_lora = str(getattr(s.engine, "num_adapters", 0)) if s else "0"
        lora.add_metric([running_names, max_lora, waiting_names, m.model_name], time.time())
        yield lora


def adapters_in_use(scheduler) -> tuple[str, str]:
    """The LoRA adapters of the running and of the waiting requests, each a comma-separated list of names (vLLM's
    label values). Copies of the scheduler's queues: it runs in its own thread."""

    def names(states) -> str:
        found = {st.request.lora.name for st in states if st.request.lora is not None}
        return ",".join(sorted(found))

    return names(list(scheduler.running)), names(list(scheduler.waiting))


class _Merged:
    """Several registries as one: a family that several models export comes out once, with every model's samples
    (each carries its model_name), as the exposition format requires."""

    def __init__(self, registries: Sequence[CollectorRegistry]):  # or any object with collect()
        self.registries = registries

    def collect(self):
        families: dict[str, prometheus_client.Metric] = {}
        for registry in self.registries:
            for family in registry.collect():
                seen = families.get(family.name)
                if seen is None:
                    families[family.name] = family
                else:
                    seen.samples.extend(family.samples)
        return list(families.values())


def render_many(models: Sequence[Metrics], embedding: object | None = None, extra: Sequence[object] = ()) -> bytes:
    """The metrics of every loaded model of a many-model daemon (and of its embedding models, and `extra`
    collectors) in one page."""
    registries = [m.registry for m in models]
    if embedding is not None and getattr(embedding, "registry", None) is not None:
        registries.append(embedding.registry)  # type: ignore[attr-defined]
    return generate_latest(_Merged([*registries, *extra]))  # type: ignore[list-item]
