"""A hand-written RL loop with the official `tinker` SDK, against `tokenflow tinker` (docs/tinker.md).

Each step: snapshot the weights into a sampling client, sample a group per prompt (every request
sent before any is awaited, so the service batches them), score each sample, centre the rewards
within the group (the advantages), train on the sampled tokens with `importance_sampling`
(prompt positions get advantage 0), and step AdamW.

* `--model default` (the shipped tiny model): prompts "a+b="; reward 1 for the right sum. Its
  tokenizer knows only digits and "+-*=,> " (a word-level vocabulary of 20), so this script
  builds prompts from token ids itself.
* `--model smollm2-135m-instruct` (or a local model folder): chat questions; the reward is higher
  the earlier the answer ends (1 - length / max_tokens, 0 when cut off at max_tokens).

    tokenflow tinker --port 8765 &
    TINKER_API_KEY=tml-local python examples/tinker/sdk_loop.py --base-url http://127.0.0.1:8765
"""

import argparse
import random

import tinker
from tinker import types

CHARS = "0123456789+-*=,> "  # the tiny model's tokens: ids 3.. (0 <pad>, 1 <bos>, 2 <eos>)


class Addition:
    max_tokens = 80

    def __init__(self, training, rng):
        self.rng, self.stop = rng, [2]  # <eos>

    def prompts(self, n):
        pairs = [(self.rng.randint(100, 99999), self.rng.randint(100, 99999)) for _ in range(n)]  # long sums: room to learn
        # <bos> first: the tiny model was trained with it, and answers far worse without it.
        return [([1] + [3 + CHARS.index(c) for c in f"{a}+{b}="], a + b) for a, b in pairs]

    def reward(self, answer, tokens, stop_reason):
        text = "".join(CHARS[t - 3] for t in tokens if t >= 3)  # "7+5=12,4+8+1=13,3+0+1=4>432"
        return float(">" in text and text.rsplit(">", 1)[1].strip() == str(answer))


class Brevity:
    max_tokens = 24
    QUESTIONS = ["What colour is the sky?", "Name a fruit.", "What is the capital of France?", "Say hello.",
                 "What is 2 + 2?", "Name an animal that swims.", "What day comes after Monday?", "Is ice cold?"]

    def __init__(self, training, rng):
        self.rng, self.tok = rng, training.get_tokenizer()  # the model folder's, offline
        self.stop = [self.tok.eos_token_id]  # SmolLM2: <|im_end|>

    def prompts(self, n):
        chat = [[{"role": "user", "content": self.rng.choice(self.QUESTIONS)}] for _ in range(n)]
        texts = [self.tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chat]
        return [(self.tok.encode(t, add_special_tokens=False), None) for t in texts]

    def reward(self, answer, tokens, stop_reason):
        return 0.0 if stop_reason == "length" else 1.0 - len(tokens) / self.max_tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default=None, help="the service (default: $TINKER_BASE_URL)")
    p.add_argument("--model", default="default", help='"default", "smollm2-135m-instruct" or a model folder')
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=8, help="prompts (groups) per step")
    p.add_argument("--group", type=int, default=8, help="samples per prompt")
    p.add_argument("--lr", type=float, default=None, help="AdamW learning rate (default 5e-4 tiny, 3e-4 else)")
    p.add_argument("--rank", type=int, default=16, help="LoRA rank")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    lr = args.lr or (5e-4 if args.model == "default" else 3e-4)

    with tinker.ServiceClient(base_url=args.base_url) as service:  # finishing the session frees the model
        training = service.create_lora_training_client(base_model=args.model, rank=args.rank, seed=args.seed).result()
        task = (Addition if args.model == "default" else Brevity)(training, rng)
        params = types.SamplingParams(max_tokens=task.max_tokens, temperature=1.0, stop=task.stop)
        for step in range(1, args.steps + 1):
            sampler = training.save_weights_and_get_sampling_client().result()  # this step's policy
            batch = task.prompts(args.prompts)
            futures = [sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=args.group,
                                      sampling_params=params) for prompt, _ in batch]
            data, rewards, lengths = [], [], []
            for (prompt, answer), future in zip(batch, futures):
                seqs = future.result().sequences
                r = [task.reward(answer, s.tokens, s.stop_reason) for s in seqs]
                mean = sum(r) / len(r)
                rewards += r
                lengths += [len(s.tokens) for s in seqs]
                for s, reward in zip(seqs, r):
                    if abs(reward - mean) < 1e-9 or not s.tokens:
                        continue  # advantage 0: nothing to learn from this sample
                    tokens, n = prompt + list(s.tokens), len(prompt) - 1  # n: prompt positions
                    data.append(types.Datum(
                        model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:],
                                        "logprobs": [0.0] * n + list(s.logprobs),  # the sampler's
                                        "advantages": [0.0] * n + [reward - mean] * len(s.tokens)}))
            if data:  # queue both; the service runs them in order
                fb = training.forward_backward(data, loss_fn="importance_sampling")
                opt = training.optim_step(types.AdamParams(learning_rate=lr))
                fb.result()
                opt.result()
            print(f"step {step:3d}  mean reward {sum(rewards) / len(rewards):.3f}  "
                  f"mean length {sum(lengths) / len(lengths):5.1f}  trained on {len(data)} samples", flush=True)
        path = training.save_state("sdk-loop-final").result().path
        print("saved", path, "(service.create_training_client_from_state_with_optimizer(path) resumes it)")


if __name__ == "__main__":
    main()
