"""Stand-in for `kvfleet logits --model DIR --ids 1,2,3` (llama_ref underneath), for
test_hf_parity_offline.py. --perturb=X adds X to every logit; a log line precedes the JSON as a
real binary's might."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import llama_ref  # noqa: E402

args = sys.argv[1:]
if not args or args[0] != "logits":
    sys.exit("usage: kvfleet logits --model DIR --ids 1,2,3")
model, ids = args[args.index("--model") + 1], llama_ref.parse_ids(args[args.index("--ids") + 1])
shift = sum(float(a.split("=", 1)[1]) for a in args if a.startswith("--perturb="))
(logits,) = llama_ref.run(model, [ids])
print("loaded %s" % model)
print(json.dumps({"logits": (logits + shift).tolist()}))
