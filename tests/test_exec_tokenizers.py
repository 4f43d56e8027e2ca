"""A checkpoint's own tokenizer drives the executor: prompts are encoded with it (BOS only when it
has one), generation stops at its EOS, answers are decoded with it for the sandbox and the
rewards. The checkpoint is a tiny random-init model saved with a word-level tokenizer built from
a local vocabulary (`executors.checkpoints.word_tokenizer`: no BOS, EOS at id 1, other ids than
the character vocabulary's); nothing is downloaded. A tokenizer with more ids than the model's
embedding has rows is refused before anything starts, naming both sizes."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from exec_util import GRPO_LAYOUT, hand_plan, job_dict

from executors import rl
from executors.checkpoints import build_checkpoint, word_tokenizer
from executors.model import CharCodec, HFCodec, codec_for, load_policy, prompt_ids
from executors.roles import RuleReward, RunConfig
from executors.run import execute, policy_arch
from executors.runplan import resolve_plan
from executors.sharding import Layout
from executors.trainer import Trainer
from executors.training import partition
from placer.base.errors import SpecError
from placer.spec.catalog import resolve
from placer.spec.load import job_from_dict

VOCAB = 40  # embedding rows: more than the tokenizer's 30 ids (real checkpoints pad too)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_checkpoint("qwen3", tmp_path_factory.mktemp("wordtok") / "qwen3", seed=3,
                            tokenizer=word_tokenizer(), vocab=VOCAB)


def test_own_tokenizer_round_trips_and_differs_from_characters(ckpt: Path) -> None:
    codec = codec_for(str(ckpt), VOCAB)
    assert isinstance(codec, HFCodec) and codec.bos is None and codec.eos == 1
    text = "3+4= the answer is \\boxed{12}"
    ids = prompt_ids(codec, text)
    assert ids != prompt_ids(CharCodec(64), text) and max(ids) < codec.size <= VOCAB
    assert ids[:4] == [6, 13, 7, 19]  # "3" "+" "4" "=": no BOS, the word vocabulary's ids
    assert codec.decode(ids + [codec.eos, 5, 6]) == text  # cut at EOS


def test_own_tokenizer_checkpoint_generates_scores_and_trains(ckpt: Path) -> None:
    codec = codec_for(str(ckpt), VOCAB)
    model = load_policy(ckpt)
    prompts = [prompt_ids(codec, "3+4="), prompt_ids(codec, "2*5=")]
    # Sampling from a random model: rows that never draw EOS run to the cap; the token budget
    # is wide so that some row does draw it (seeded: the same rows every run)
    resp, lps = rl.generate(model, prompts, 40, seeds=[1, 2], eos=codec.eos)
    assert all(len(r) == len(lp) >= 1 for r, lp in zip(resp, lps))
    assert all(codec.eos not in r[:-1] for r in resp)  # generation stops at the tokenizer's EOS
    assert any(r[-1] == codec.eos for r in resp), resp
    arch = resolve(job_from_dict(job_dict(models={"policy": {"path": str(ckpt)}}))).arch_of("actor")
    cfg = RunConfig(algorithm="grpo", arch=arch.model_dump(), model_dir=str(ckpt), seed=0,
                    max_new_tokens=40, lr=1e-3, data={"path": str(ckpt / "math.jsonl")})
    assert cfg.codec is codec
    (ckpt / "math.jsonl").write_text('{"prompt": "3+4=", "answer": "7"}\n')
    s = rl.Samples(["a", "b"], prompts, resp, lps, 0, ["g", "g"])
    # the reward reads the tokenizer's text: an answer "7" (ids of the word vocabulary) is exact
    seven = codec.encode("7") + [codec.eos]
    exact = rl.Samples(["c"], prompts[:1], [seven], [[0.0] * len(seven)], 0, ["g"])
    assert RuleReward(cfg).score(exact, [{}], ["7"])[0] == [1.0]
    rewards, _ = RuleReward(cfg).score(s, [{}, {}], ["7", "10"])
    assert all(0.0 <= r <= 1.0 for r in rewards)
    tr = Trainer(cfg)
    before = {k: v.clone() for k, v in tr.weights().items()}
    adv = [[1.0] * len(resp[0]), [-1.0] * len(resp[1])]
    info, _ = tr.train(partition(s, adv, None, Layout(), 1, 1)[0])
    assert torch.isfinite(torch.tensor(info["loss"])) and info["optimizer_steps"] == 1
    assert any(not torch.equal(before[k], v) for k, v in tr.weights().items())


def test_execute_runs_a_checkpoint_with_its_own_tokenizer(ckpt: Path, tmp_path: Path) -> None:
    """Two GRPO steps of the whole loop (one process): prompts, EOS, verifier and rewards all
    through the checkpoint's tokenizer."""
    data = tmp_path / "math.jsonl"
    data.write_text("".join(f'{{"prompt": "{a}+{b}=", "answer": "{a + b}"}}\n'
                            for a in range(3) for b in range(3)))
    plan = hand_plan(GRPO_LAYOUT, job_dict(models={"policy": {"path": str(ckpt)}, "reward": "rule"},
                                           data={"path": str(data)}))
    result = execute(plan, 2, tmp_path / "out", local=True)
    assert len(result.stats) == 2 and result.ledger_ok, result.ledger_problems
    assert all(0.0 <= s.reward <= 1.0 and s.loss == s.loss for s in result.stats)
    codec = codec_for(str(ckpt), VOCAB)
    gens = result.trace.of("generate")
    # "a+b=" is 4 ids in the word vocabulary (no BOS); the character codec would add BOS
    assert {n for e in gens for n in e.args["prompt_tokens"]} == {len(prompt_ids(codec, "1+2="))} \
        == {4}
    lengths = [n for e in gens for n in e.args["response_tokens"]]
    assert lengths and max(lengths) <= plan.resolved().job.lengths.response.max_value()


def test_tokenizer_larger_than_the_embedding_is_refused(tmp_path: Path) -> None:
    small = build_checkpoint("llama", tmp_path / "small", seed=0, tokenizer=word_tokenizer(),
                             vocab=24)
    plan = hand_plan(GRPO_LAYOUT, job_dict(models={"policy": {"path": str(small)}}))
    with pytest.raises(SpecError, match=r"models.paths.policy: .*its tokenizer has 30 tokens "
                                        r"\(eos id 1\) but the model's embedding has 24 rows"):
        policy_arch(resolve_plan(plan).job)
    (small / "tokenizer.json").write_text("{not json")
    with pytest.raises(SpecError, match=r"models.paths.policy: .*its tokenizer does not load"):
        policy_arch(resolve_plan(plan).job)
