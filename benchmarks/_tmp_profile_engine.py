# TEMPORARY (not committed): where does a decode step's time go?
import sys, time, random, statistics, os
sys.path.insert(0, "/tmp"); sys.path.insert(0, "benchmarks")
import patch  # noqa
import torch
import bench_engine as B
from nibblekv.engine.engine import Engine
from nibblekv.engine.sampling_params import SamplingParams
import nibblekv.engine.cuda_graph as G, nibblekv.engine.model_runner as MR, nibblekv.engine.scheduler as S, nibblekv.engine.engine as E

T = {}
def timed(obj, name, sync=False):
    fn = getattr(obj, name)
    def w(*a, **k):
        if sync: torch.cuda.synchronize()
        t = time.perf_counter(); r = fn(*a, **k)
        if sync: torch.cuda.synchronize()
        T.setdefault(f"{obj.__name__}.{name}", []).append(time.perf_counter() - t); return r
    setattr(obj, name, w)
timed(S.Scheduler, "schedule"); timed(S.Scheduler, "postprocess"); timed(E.Engine, "_emit")
timed(MR, "host_metadata"); timed(G.CudaGraphRunner, "_fill", True); timed(G.CudaGraphRunner, "_demote", True)
timed(MR.ModelRunner, "_sample", True); timed(MR.ModelRunner, "run", True)
g_replay = torch.cuda.CUDAGraph.replay
def rep(self):
    torch.cuda.synchronize(); t = time.perf_counter(); g_replay(self); torch.cuda.synchronize()
    T.setdefault("graph.replay", []).append(time.perf_counter() - t)
torch.cuda.CUDAGraph.replay = rep

loaded = B.load_model("llama-3.1-8b", load_format="dummy", device="cuda", seed=0)
kv = sys.argv[1]; n = int(sys.argv[2]); L = int(sys.argv[3])
e = Engine(loaded=loaded, kv_cache_dtype=kv, max_running_requests=n, context_length=L + 64, decode_log_interval=0)
rng = random.Random(0)
prompts = [[rng.randrange(10, 30000) for _ in range(L)] for _ in range(n)]
B.synthetic_prefill(e, prompts, SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True))
steps = []
while e.has_unfinished():
    torch.cuda.synchronize(); t = time.perf_counter(); e.step(); torch.cuda.synchronize(); steps.append(time.perf_counter() - t)
print(kv, n, L, "step median ms %.2f" % (1e3 * statistics.median(steps)))
for k, v in T.items():
    print("  %-28s n=%3d median %.3f ms" % (k, len(v), 1e3 * statistics.median(v)))
