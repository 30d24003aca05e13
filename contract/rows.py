"""A report row: its columns and its statuses (README / docs "Report schema").

One row per (run, family, features, backend, device, dtype, kv mode, seed,
candidate, reference, layer, probe). The statuses and the order that decides a
case's status are the verdict rules' vocabulary (harness/verdict.py applies
them); a candidate or a view reads them from here.
"""

from __future__ import annotations

# every status a row may carry
STATUSES = ("pass", "fail", "error", "unguarded", "missing", "finding", "not-exposed", "not-implemented", "skipped")
# the statuses that fail a case (and a run: exit status 1)
FAILING = ("unguarded", "missing", "error", "fail")
# a case's status is the first of these its rows have
CASE_ORDER = ("unguarded", "missing", "error", "fail", "pass", "finding", "not-implemented", "not-exposed", "skipped")

# column -> what it holds (the report schema; docs/reference/report-schema.md is generated from it)
ROW_COLUMNS = {
    "case_id": "the case's id (family/backend-device-dtype/kv/schedule/ref/seed/tokens/...)",
    "family": "model family",
    "features": "the case's feature tags, ';'-separated (harness/features.py)",
    "backend": "impl's array backend (numpy, torch)",
    "device": "cpu, cuda, mps",
    "dtype": "the case's compute dtype",
    "kv": "KV backing: decode, batched, paged",
    "schedule": "rows per call: prefill, decode, mixed, or chunk sizes",
    "seed": "seed of the weights and the token ids",
    "tokens": "rows per sequence (a ragged case: of the longest)",
    "seqs": "sequences",
    "gguf_type": "the GGUF weight type llama.cpp ran",
    "weights": "the seeded model's weights: random, or realistic (a trained model's statistics)",
    "ragged": "whether the sequences differ in length, first call and arrival (continuous batching)",
    "overrides": "HF config overrides, ';'-separated key=value",
    "candidate": "the side judged (impl, another engine, or a reference compared with another)",
    "reference": "the side it is judged against ('-' for a row about the case itself)",
    "layer": "decoder layer (-1: a model-level probe or the case)",
    "probe": "the probe compared (contract.probes; '*' for a whole layer or case)",
    "variant": "the family's named variant",
    "layer_kind": "the layer's kind label (attention, linear, absent, mla_absorbed, ...)",
    "status": "one of STATUSES",
    "reason": "why, in words (the bound exceeded, the finding that excuses it, what is not exposed)",
    "detail": "an error row's full traceback (the exception behind it; also in the run's log.txt); empty otherwise",
    "cmp_dtype": "the comparison's dtype: the less precise side, or ggml_<act> with ggml's rounding emulated",
    "max_abs": "max |candidate - reference|",
    "max_rel": "max |candidate - reference| / |reference|",
    "mean_abs": "mean |candidate - reference|",
    "rmse": "root mean square error",
    "nmse": "sum((c - r)^2) / sum(r^2) (llama.cpp test-backend-ops' normalisation)",
    "cosine": "cosine similarity",
    "worst": "index of the worst element, named by the probe's axes",
    "min_atol": "the smallest atol that would pass (= max_abs)",
    "finite": "whether both sides are finite",
    "nmse_cand_oracle": "the candidate's NMSE to the float64 oracle (oracle-judged rows)",
    "nmse_ref_oracle": "the reference's NMSE to the float64 oracle (oracle-judged rows)",
    "err_ratio": "the worst error over its bound (> 1 fails)",
    "tol_nmse": "the NMSE bound applied",
    "tol_atol": "the max_abs bound applied",
    "tol_reason": "why the bound is what it is (the policy's table, an override's reason)",
}
