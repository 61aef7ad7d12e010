"""Why one prefill as vLLM serves it takes longer than its kernels timed one by one (H200).

``python3 benchmarks/device/h200_prefill_sustained.py OUT_DIR``  (needs torch with CUDA; not a
test). Random weights, no checkpoint, no vLLM. Three experiments, each printed and written to
``OUT_DIR/results.json``:

1. **FP8 and bf16 GEMMs, one by one against back to back.** The four GEMMs of a Llama-3.1-70B
   layer at TP 1 (QKV, output, gate/up, down; FP8 through ``torch._scaled_mm`` with per-tensor
   scales, as vLLM's CUTLASS FP8 kernel) at 1,024 and 7,424 tokens. *Isolated*: each GEMM after
   an idle pause, a few repetitions (how kernel tables such as AIConfigurator's are measured).
   *Sustained*: a whole 80-layer prefill pass of them back to back, repeated (how a long prefill
   runs): the first pass and the median of the later ones. SM clock and board power are sampled
   by ``nvidia-smi`` in the background, so a power-limited clock shows.
2. **Prefill attention** (FlashAttention through SDPA, causal, 64 query / 8 KV heads of 128) of
   one 1,024- and 7,424-token prompt, bf16, per layer.
3. **Eager against CUDA-graph prefill** of a decoder layer stack (32 layers, Llama-3-8B layer
   at TP 1 and its TP 8 shard) at 256-2,048 tokens: the wall time of launching the layers op by
   op (as a prefill above the CUDA-graph capture sizes runs) against one graph replay.
"""

import json
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F

DEV = "cuda"
BF = torch.bfloat16
FP8 = torch.float8_e4m3fn
H70, I70, Q70, KV70, D = 8192, 28672, 64, 8, 128
LAYERS70 = 80


class Sampler:
    """SM clock (MHz) and power (W) from nvidia-smi every 50 ms while active."""

    def __init__(self):
        self.rows, self.proc = [], None

    def start(self):
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                 "-lms", "50"], stdout=subprocess.PIPE, text=True)
        except OSError:
            self.proc = None
            return
        def read():
            for line in self.proc.stdout:
                try:
                    c, p = (float(v) for v in line.split(","))
                    self.rows.append((time.perf_counter(), c, p))
                except ValueError:
                    pass
        threading.Thread(target=read, daemon=True).start()

    def window(self, t0, t1):
        sel = [(c, p) for t, c, p in self.rows if t0 <= t <= t1]
        if not sel:
            return None
        return {"sm_clock_mhz_median": statistics.median(c for c, _ in sel),
                "power_w_median": statistics.median(p for _, p in sel), "samples": len(sel)}

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()


def events_ms(fn, reps):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps


def gemm_experiment(sampler, out):
    shapes = {"qkv": (H70, (Q70 + 2 * KV70) * D), "o": (Q70 * D, H70),
              "gate_up": (H70, 2 * I70), "down": (I70, H70)}
    g = torch.Generator(device=DEV).manual_seed(0)
    w_bf = {k: (torch.randn(n, kk, device=DEV, dtype=BF, generator=g) * 0.02)
            for k, (kk, n) in shapes.items()}
    w_f8 = {k: v.to(FP8) for k, v in w_bf.items()}
    one = torch.ones((), device=DEV, dtype=torch.float32)
    for m in (1024, 7424):
        x_bf = {k: torch.randn(m, kk, device=DEV, dtype=BF, generator=g) for k, (kk, n) in shapes.items()}
        x_f8 = {k: v.to(FP8) for k, v in x_bf.items()}
        flops_layer = sum(2.0 * m * kk * n for kk, n in shapes.values())
        calls = {
            "fp8": {k: (lambda k=k: torch._scaled_mm(x_f8[k], w_f8[k].t(), one, one, out_dtype=BF))
                    for k in shapes},
            "bf16": {k: (lambda k=k: F.linear(x_bf[k], w_bf[k])) for k in shapes},
        }
        for dtype, fns in calls.items():
            iso = {}
            for k, fn in fns.items():
                fn(); torch.cuda.synchronize(); time.sleep(0.3)
                iso[k] = events_ms(fn, 5)
            iso_layer = sum(iso.values())

            def prefill_pass():
                for _ in range(LAYERS70):
                    for fn in fns.values():
                        fn()
            passes = 4 if m > 2000 else 20
            torch.cuda.synchronize(); time.sleep(1.0)
            times, t0 = [], time.perf_counter()
            for _ in range(passes):
                times.append(events_ms(prefill_pass, 1))
            t1 = time.perf_counter()
            row = {"experiment": "gemm", "dtype": dtype, "tokens": m,
                   "isolated_layer_ms": iso_layer, "isolated_ms": iso,
                   "isolated_tflops": flops_layer / iso_layer / 1e9,
                   "sustained_first_pass_ms": times[0],
                   "sustained_median_pass_ms": statistics.median(times[1:]),
                   "sustained_tflops": flops_layer * LAYERS70 / statistics.median(times[1:]) / 1e9,
                   "sustained_over_isolated": statistics.median(times[1:]) / (iso_layer * LAYERS70),
                   "telemetry": sampler.window(t0 + 0.2, t1)}
            print(json.dumps(row), flush=True)
            out.append(row)
            time.sleep(1.0)
        del x_bf, x_f8
    del w_bf, w_f8
    torch.cuda.empty_cache()


def attention_experiment(out):
    g = torch.Generator(device=DEV).manual_seed(1)
    for n in (1024, 7424):
        q = torch.randn(1, Q70, n, D, device=DEV, dtype=BF, generator=g)
        k = torch.randn(1, KV70, n, D, device=DEV, dtype=BF, generator=g)
        v = torch.randn(1, KV70, n, D, device=DEV, dtype=BF, generator=g)
        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        fn(); torch.cuda.synchronize()
        ms = events_ms(fn, 10)
        flops = 4.0 * Q70 * D * n * n / 2
        row = {"experiment": "prefill_attention", "tokens": n, "heads": Q70, "kv_heads": KV70,
               "head_dim": D, "ms_per_layer": ms, "tflops": flops / ms / 1e9}
        print(json.dumps(row), flush=True)
        out.append(row)


def layer_stack_experiment(out):
    H, HQ, HKV, HD, I, L = 4096, 32, 8, 128, 14336, 32
    g = torch.Generator(device=DEV).manual_seed(2)
    for shard in (1, 8):
        hq, hkv, inter = HQ // shard, max(1, HKV // shard), I // shard
        W = {"qkv": torch.randn((hq + 2 * hkv) * HD, H, device=DEV, dtype=BF, generator=g) * .02,
             "o": torch.randn(H, hq * HD, device=DEV, dtype=BF, generator=g) * .02,
             "gu": torch.randn(2 * inter, H, device=DEV, dtype=BF, generator=g) * .02,
             "d": torch.randn(H, inter, device=DEV, dtype=BF, generator=g) * .02,
             "nw": torch.ones(H, device=DEV, dtype=BF)}

        def rms(x):
            return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(BF) * W["nw"]

        def stack(x):
            t = x.shape[0]
            for _ in range(L):
                h = rms(x)
                qkv = F.linear(h, W["qkv"])
                q, k, v = qkv.split([hq * HD, hkv * HD, hkv * HD], dim=-1)
                q = q.view(t, hq, HD).transpose(0, 1) * 1.0001      # stands for rotary
                k = k.view(t, hkv, HD).transpose(0, 1) * 1.0001
                v = v.view(t, hkv, HD).transpose(0, 1)
                a = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True,
                                                   enable_gqa=True)
                x = x + F.linear(a[0].transpose(0, 1).reshape(t, hq * HD), W["o"])
                h = rms(x)
                gu = F.linear(h, W["gu"])
                x = x + F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], W["d"])
            return x

        for t in (256, 1024, 2048):
            x = torch.randn(t, H, device=DEV, dtype=BF, generator=g)
            for _ in range(2):
                stack(x)
            torch.cuda.synchronize()
            walls = []
            for _ in range(5):
                t0 = time.perf_counter(); stack(x); torch.cuda.synchronize()
                walls.append((time.perf_counter() - t0) * 1e3)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                stack(x)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                stack(x)
            graph.replay(); torch.cuda.synchronize()
            gms = events_ms(graph.replay, 5)
            eager_gpu = events_ms(lambda: stack(x), 3)
            row = {"experiment": "eager_vs_graph", "tp_shard": shard, "layers": L, "tokens": t,
                   "eager_wall_ms": statistics.median(walls), "eager_events_ms": eager_gpu,
                   "graph_ms": gms,
                   "eager_extra_per_layer_us": (statistics.median(walls) - gms) / L * 1e3}
            print(json.dumps(row), flush=True)
            out.append(row)
            del graph
        del W
        torch.cuda.empty_cache()


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    print(json.dumps(info), flush=True)
    rows = []
    sampler = Sampler()
    sampler.start()
    try:
        time.sleep(0.5)
        idle = sampler.window(0, time.perf_counter())
        info["idle_telemetry"] = idle
        gemm_experiment(sampler, rows)
        attention_experiment(rows)
        layer_stack_experiment(rows)
    finally:
        sampler.stop()
        with open(f"{out_dir}/results.json", "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
