"""tokenize / detokenize with the default model's real ids; stats and plugins as typed
results."""

from __future__ import annotations

import dataclasses

import inferd
from client_helpers import FrameChecker, run
from inferd_daemon import Daemon


def test_tokenize_and_detokenize_round_trip(daemon: Daemon, check: FrameChecker) -> None:
    async def body() -> None:
        async with inferd.connect(daemon.url, on_frame=check) as c:
            # SmolLM2's ids, as in docs/protocol.md's echo example (no BOS is added).
            assert await c.tokenize("The sky is") == [504, 6376, 314]
            assert await c.detokenize([504, 6376, 314]) == "The sky is"
            text = "Grüße, 世界! 🌍"
            assert await c.detokenize(await c.tokenize(text)) == text
            # Special-token text maps to its control id only when asked to.
            assert await c.tokenize("<|im_end|>", special=True) == [2]
            plain = await c.tokenize("<|im_end|>")
            assert len(plain) > 1 and await c.detokenize(plain) == "<|im_end|>"
            assert await c.tokenize("") == []

    run(body())


def test_stats_are_typed_and_cover_every_field(daemon: Daemon, check: FrameChecker) -> None:
    async def body() -> inferd.Stats:
        async with inferd.connect(daemon.url, on_frame=check) as c:
            return await c.stats()

    st = run(body())
    assert isinstance(st, inferd.Stats)
    assert isinstance(st.prefix_cache, inferd.PrefixCacheStats)
    assert isinstance(st.speculative, inferd.SpeculativeStats)
    assert st.running == 0 and st.kv_block_size == 16 and st.kv_blocks_total > 0
    assert st.prefix_cache.enabled and st.speculative.method in ("ngram", "draft", "off")
    assert st.lora == inferd.LoraStats(running=[], waiting=[])
    assert st.kv_events == inferd.KvEventStats(published=0, dropped=0)
    # The dataclasses name every field the daemon sends (and nothing else).
    (frame,) = [f for f in check.frames if f["type"] == "stats"]
    assert set(frame) - {"type", "id"} == {f.name for f in dataclasses.fields(inferd.Stats)}
    for field in ("prefix_cache", "speculative", "lora", "kv_events"):
        assert set(frame[field]) == {f.name for f in dataclasses.fields(getattr(st, field))}
    # One engine: its share is the whole.
    assert st.engines is not None and len(st.engines) == 1
    (e,) = st.engines
    assert isinstance(e, inferd.EngineShare)
    assert (e.running, e.kv_blocks_total) == (0, st.kv_blocks_total)
    assert set(frame["engines"][0]) == {f.name for f in dataclasses.fields(inferd.EngineShare)}


def test_plugins_are_typed(daemon: Daemon, check: FrameChecker) -> None:
    async def body() -> inferd.Plugins:
        async with inferd.connect(daemon.url, on_frame=check) as c:
            return await c.plugins()

    p = run(body())
    assert p.interface == "inferd:plugin@0.1.1"
    by_name = {x.name: x for x in p.plugins}
    assert [x.name for x in p.plugins] == sorted(by_name)
    assert {"ban_words", "mirostat", "noop", "trap"} <= set(by_name)
    assert by_name["mirostat"].world == "sampler" and by_name["ban_words"].world == "logits-processor"
    assert by_name["ban_words"].file == "ban_words.wasm" and by_name["ban_words"].interface == p.interface
    # The test profile's limits (configs/test.toml) and the daemon's own measurements.
    assert by_name["ban_words"].limits == inferd.PluginLimits(200.0, 5000.0, 64 << 20, 16)
    cost = by_name["ban_words"].cost
    assert cost is not None and cost.instantiations >= 1 and cost.instantiate_ms_mean > 0
    (frame,) = [f for f in check.frames if f["type"] == "plugins"]
    assert all(set(x) == {f.name for f in dataclasses.fields(inferd.PluginInfo)} for x in frame["plugins"])
    assert all(set(x["limits"]) == {f.name for f in dataclasses.fields(inferd.PluginLimits)} for x in frame["plugins"])
    assert all(set(x["cost"]) == {f.name for f in dataclasses.fields(inferd.PluginCost)} for x in frame["plugins"])
