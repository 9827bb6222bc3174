"""GSM8K on the served model, through lm-eval against an OpenAI-compatible server.

The end-to-end check of the NoPE fixes: a model whose sparse MLA runs on the fixed kernels
must still score as published. Usage:

    nopebench gsm8k --config glm53-flash-nvfp4-tp4                 # launch vLLM, evaluate, stop it
    nopebench gsm8k --config glm53-flash-nvfp4-tp4 --base-url URL  # evaluate a running server
    nopebench gsm8k --config ... --data DIR                        # offline: DIR/{train,test}.jsonl
    nopebench gsm8k --config ... --limit 50                        # the first 50 problems only
    nopebench gsm8k --config ... --resume results/gsm8k/<run>      # continue a failed/killed run

Without --data the problems come from the model hub (openai/gsm8k); with it no hub is contacted.
A run directory holds config.json, task.yaml, server.log (launch mode), lm_eval.log, the request
cache (requests_rank0.db), results.json, samples.jsonl and run.json (status and summary).

Modules by concern: `config` (the YAML), `data` (hub or local jsonl, lm-eval's own task),
`server` (check or launch, always stop), `evaluate` (lm-eval in process, per-answer
persistence, progress), `resume`, `summary` (records and table), and `command`, which ties
them together.
"""
