"""Whole-iteration timings of a Llama-3-8B-shaped decoder on one GPU (run on the H200 machine).

``python3 benchmarks/device/h200_iteration.py OUT_DIR``  (needs torch with CUDA; not a test)

Random bf16 weights (no checkpoint); one layer's weights and KV cache are allocated once and run
32 times per step, which times the same kernels as 32 distinct layers (each layer's weights,
0.44 GB, are far larger than the 60 MB L2, so nothing stays cached between layers). Per batch size
it records, for a decode step at a fixed context:
- ``graph_gpu_ms``: one CUDA-graph replay timed with CUDA events: pure GPU time;
- ``graph_roundtrip_ms``: replay + sampled ids copied to the host + synchronise, wall clock: what a
  scheduler that overlaps its own work with the GPU still pays per iteration;
- ``eager_ms``: the same step launched op by op from Python, wall clock (a launch-bound engine).
And prefill steps (one sequence of P tokens) timed with CUDA events. Writes results.json.
"""

import json
import sys
import time

import torch
import torch.nn.functional as F

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, LAYERS = 4096, 32, 8, 128, 14336, 128256, 32
DEV = "cuda"
DT = torch.bfloat16


def weights():
    g = torch.Generator(device=DEV).manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, device=DEV, dtype=DT, generator=g) * 0.02)

    return {"qkv": w((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), "o": w(HIDDEN, HIDDEN),
            "gate_up": w(2 * INTER, HIDDEN), "down": w(HIDDEN, INTER),
            "norm": torch.ones(HIDDEN, device=DEV, dtype=DT), "lm_head": w(VOCAB, HIDDEN)}


def rms(x, weight):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype) * weight


def layer(x, W, k_cache, v_cache, prefill):
    """One decoder layer; x is (B, T, H)."""
    b, t, _ = x.shape
    h = rms(x, W["norm"])
    qkv = F.linear(h, W["qkv"])
    q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    q = q.view(b, t, HEADS, HEAD_DIM).transpose(1, 2)
    if prefill:
        k = k.view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = v.view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:
        # decode: attend over the cached context (the new token's KV write is a tiny copy)
        k_cache[:, :, -1:, :] = k.view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
    a = a.transpose(1, 2).reshape(b, t, HIDDEN)
    x = x + F.linear(a, W["o"])
    h = rms(x, W["norm"])
    gu = F.linear(h, W["gate_up"])
    g, u = gu.chunk(2, dim=-1)
    return x + F.linear(F.silu(g) * u, W["down"])


def step(x, W, k_cache, v_cache, prefill=False):
    for _ in range(LAYERS):
        x = layer(x, W, k_cache, v_cache, prefill)
    logits = F.linear(rms(x[:, -1, :], W["norm"]), W["lm_head"])
    return logits.argmax(-1)


def time_events(fn, reps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def decode_case(W, batch, ctx, out):
    x = torch.randn(batch, 1, HIDDEN, device=DEV, dtype=DT)
    k_cache = torch.randn(batch, KV_HEADS, ctx, HEAD_DIM, device=DEV, dtype=DT)
    v_cache = torch.randn(batch, KV_HEADS, ctx, HEAD_DIM, device=DEV, dtype=DT)
    for _ in range(3):
        step(x, W, k_cache, v_cache)
    torch.cuda.synchronize()
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        ids = step(x, W, k_cache, v_cache)
        ids.cpu()
    eager = (time.perf_counter() - t0) / reps * 1e3
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step(x, W, k_cache, v_cache)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids = step(x, W, k_cache, v_cache)
    gpu = time_events(graph.replay, reps)
    host = torch.empty(batch, dtype=ids.dtype, pin_memory=True)
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        graph.replay()
        host.copy_(ids, non_blocking=True)
        torch.cuda.synchronize()
    roundtrip = (time.perf_counter() - t0) / reps * 1e3
    out.append({"phase": "decode", "batch": batch, "context": ctx, "graph_gpu_ms": gpu,
                "graph_roundtrip_ms": roundtrip, "eager_ms": eager})
    print(out[-1], flush=True)
    del graph, k_cache, v_cache
    torch.cuda.empty_cache()


def prefill_case(W, tokens, out):
    x = torch.randn(1, tokens, HIDDEN, device=DEV, dtype=DT)
    gpu = time_events(lambda: step(x, W, None, None, prefill=True), 5)
    out.append({"phase": "prefill", "batch": 1, "tokens": tokens, "gpu_ms": gpu})
    print(out[-1], flush=True)


def main():
    out_dir = sys.argv[1]
    torch.backends.cuda.matmul.allow_tf32 = True
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "model": "llama-3-8b shape", "layers": LAYERS}
    print(info, flush=True)
    W = weights()
    rows = []
    for batch in (1, 8, 32, 64, 128, 256):
        try:
            decode_case(W, batch, 1024, rows)
        except Exception as exc:  # keep the other cases
            rows.append({"phase": "decode", "batch": batch, "error": repr(exc)})
            print(rows[-1], flush=True)
        with open(f"{out_dir}/results.json", "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)
    for tokens in (128, 512, 2048, 4096):
        try:
            prefill_case(W, tokens, rows)
        except Exception as exc:
            rows.append({"phase": "prefill", "tokens": tokens, "error": repr(exc)})
            print(rows[-1], flush=True)
        with open(f"{out_dir}/results.json", "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
