"""torchtitan 0.3's pipeline stage split, dumped for tests/pp/compare_stages.lua (issue 22):
for a matrix of (schedule, pp, n_layers, layers_per_stage, first/last_stage_less_layers), the
number of stages and stages per rank (_get_pipeline_metadata), each stage's module names
(_generate_llm_fqn_per_model_part) and each PP rank's stage indices
(_get_pp_rank_to_stage_indices_mapping), or the error torchtitan raises. One JSON object per
line on stdout."""
import json
import sys
import types

from torchtitan.distributed import pipeline_parallel as ppl

SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble",
             "DualPipeV"]


def case(schedule, pp, n_layers, lps, inw, outw):
    dims = types.SimpleNamespace(pp=pp)
    par = types.SimpleNamespace(pipeline_parallel_schedule=schedule, pipeline_parallel_layers_per_stage=lps,
                                pipeline_parallel_first_stage_less_layers=inw,
                                pipeline_parallel_last_stage_less_layers=outw)
    cfg = types.SimpleNamespace(layers=[None] * n_layers)
    out = {"schedule": schedule, "pp": pp, "n_layers": n_layers, "layers_per_stage": lps,
           "first_stage_less_layers": inw, "last_stage_less_layers": outw}
    try:
        n, _, iw, ow = ppl._get_pipeline_metadata(dims, par, cfg)
        out["stages"] = n
        out["split"] = ppl._generate_llm_fqn_per_model_part(n, n_layers, iw, ow)
        out["ranks"] = [list(ppl._get_pp_rank_to_stage_indices_mapping(r, pp, schedule, n)) for r in range(pp)]
    except (ValueError, AssertionError) as e:
        out["error"] = type(e).__name__
    return out


def main():
    n = 0
    for schedule in SCHEDULES:
        for pp in (1, 2, 4, 8):
            for n_layers in (2, 7, 16, 32, 126):
                for lps in (None, 1, 2, 3, 4, 8):
                    for inw, outw in ((1, 1), (0, 0), (2, 3)):
                        if pp == 1 and schedule not in ("GPipe", "1F1B"):
                            continue
                        print(json.dumps(case(schedule, pp, n_layers, lps, inw, outw), sort_keys=True))
                        n += 1
    sys.stderr.write("titan-stages: %d cases\n" % n)


if __name__ == "__main__":
    main()
