"""DeepSpeed-Chat's RewardModel.forward loss on given per-token rewards,
with torch autograd for the gradients. Usage: reward_ref.py CASES.json; each
case {"chosen_ids", "rejected_ids", "chosen_rewards", "rejected_rewards"
(bs x T lists), "pad_id", "npb"}; prints one JSON line per case: loss, the
chosen and rejected scores and the gradients (bs x T). Exits 77 without torch."""
import json
import math
import sys

try:
    import torch
except ImportError:
    print("SKIP: torch is not importable by", sys.executable)
    sys.exit(77)


def forward(chosen_ids, rejected_ids, chosen_rewards, rejected_rewards, pad_id, npb):
    # The loop of dschat/utils/model/reward_model.py's RewardModel.forward.
    bs, seq_len = chosen_ids.shape
    chosen_mean_scores, rejected_mean_scores = [], []
    loss = 0.
    for i in range(bs):
        chosen_id, rejected_id = chosen_ids[i], rejected_ids[i]
        chosen_reward, rejected_reward = chosen_rewards[i], rejected_rewards[i]
        c_inds = (chosen_id == pad_id).nonzero()
        c_ind = c_inds[npb].item() if len(c_inds) > npb else seq_len
        check_divergence = (chosen_id != rejected_id).nonzero()
        if len(check_divergence) == 0:
            end_ind = rejected_reward.size(-1)
            divergence_ind = end_ind - 1
            r_ind = c_ind
        else:
            r_inds = (rejected_id == pad_id).nonzero()
            r_ind = r_inds[npb].item() if len(r_inds) > npb else seq_len
            end_ind = max(c_ind, r_ind)
            divergence_ind = check_divergence[0]
        assert divergence_ind > 0
        c_truncated_reward = chosen_reward[divergence_ind:end_ind]
        r_truncated_reward = rejected_reward[divergence_ind:end_ind]
        chosen_mean_scores.append(chosen_reward[c_ind - 1])
        rejected_mean_scores.append(rejected_reward[r_ind - 1])
        loss += -torch.nn.functional.logsigmoid(c_truncated_reward - r_truncated_reward).mean()
    return loss / bs, torch.stack(chosen_mean_scores), torch.stack(rejected_mean_scores)


if __name__ == "__main__":
    for case in json.load(open(sys.argv[1])):
        c = torch.tensor(case["chosen_rewards"], dtype=torch.float64, requires_grad=True)
        r = torch.tensor(case["rejected_rewards"], dtype=torch.float64, requires_grad=True)
        loss, cs, rs = forward(torch.tensor(case["chosen_ids"]), torch.tensor(case["rejected_ids"]), c, r,
                               case["pad_id"], case["npb"])
        if torch.isfinite(loss):
            loss.backward()
        grad = lambda t: (t.grad if t.grad is not None else torch.zeros_like(t)).tolist()
        print(json.dumps({"loss": loss.item() if torch.isfinite(loss) else None, "chosen_scores": cs.tolist(),
                          "rejected_scores": rs.tolist(), "dchosen": grad(c), "drejected": grad(r)}))
