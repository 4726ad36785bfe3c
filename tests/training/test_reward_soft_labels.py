"""End-to-end: a tiny reward model trained on soft labels learns what the labels say."""

import random

from training.trainers import reward


def _phrasing_rows(n: int, *, seed: int) -> list[dict]:
    """Return rows where annotators found two phrasings of the right sum equally good (q = 1/2).

    The exporter writes a tie as soft_label 0.5 with one answer, arbitrarily, as "chosen".
    """
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        rows.append(
            {
                "prompt": f"Q: What is {a} + {b}?\nA:",
                "chosen": f" {a} + {b} = {a + b}.",
                "rejected": f" The answer is {a + b}!",
                "soft_label": 0.5,
            }
        )
    return rows


def _mean_gap(scorer, rows) -> float:
    prompts = [r["prompt"] for r in rows]
    first = scorer.score(prompts, [r["chosen"] for r in rows])
    second = scorer.score(prompts, [r["rejected"] for r in rows])
    return sum(f - s for f, s in zip(first, second, strict=True)) / len(rows)


def test_soft_labels_keep_equally_liked_answers_together(tmp_path, tiny_reward_dir, make_snapshot):
    # Given pairs labelled "equally good", which plain Bradley-Terry reads as sure wins,
    snapshot = make_snapshot(train=_phrasing_rows(64, seed=1))
    held_out = _phrasing_rows(24, seed=2)
    gaps = {}
    for soft in (False, True):
        config = reward.Config(
            model_name_or_path=str(tiny_reward_dir),
            max_steps=24,
            learning_rate=1e-3,
            per_device_train_batch_size=8,
            logging_steps=8,
            save_steps=100,
            soft_labels=soft,
        )
        out = tmp_path / f"soft-{soft}"
        reward.train(config, snapshot, out)
        gaps[soft] = _mean_gap(reward.RewardScorer(out / "final", device="cpu"), held_out)
    # then hard labels learn a preference for the first phrasing that nobody expressed,
    assert gaps[False] > 1.0
    # while q = 1/2 keeps their rewards close (the loss is smallest at a gap of 0).
    assert abs(gaps[True]) < 0.25
    assert abs(gaps[True]) < gaps[False] / 4


def test_logged_accuracy_counts_decided_pairs_only(tmp_path, tiny_reward_dir, make_snapshot):
    from tests.training.conftest import arithmetic_rows, last_logged
    from training.trainers.data import load_preferences

    # Given a validation split of 8 decided pairs and 8 ties (a tie has no right order),
    # the export puts either answer of a tie first; here the refusal, which training ranks low.
    ties = [
        {**row, "chosen": row["rejected"], "rejected": row["chosen"], "tie": True}
        for row in arithmetic_rows(8, seed=3)
    ]
    snapshot = make_snapshot(
        train=arithmetic_rows(32, seed=1), validation=arithmetic_rows(8, seed=2) + ties
    )
    config = reward.Config(
        model_name_or_path=str(tiny_reward_dir),
        max_steps=2,
        learning_rate=1e-3,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        logging_steps=2,
        save_steps=100,
    )
    out = tmp_path / "run"
    reward.train(config, snapshot, out)
    # then the logged accuracy is the accuracy on the decided pairs alone.
    decided = [r for r in load_preferences(snapshot).validation if not r["tie"]]
    scorer = reward.RewardScorer(out / "final", device="cpu")
    assert (
        last_logged(out, "eval_accuracy") == reward.pairwise_accuracy(scorer, decided)["accuracy"]
    )
