"""Simulated annotators score demo prompts with the demo's true reward, others by a latent one."""

from annotation.simulation import default_score, hidden_quality
from training import demo


def test_demo_prompts_are_scored_by_the_true_reward_registered_at_startup():
    prompt = demo.generate_prompts(1, seed=0)[0]
    problem = demo.parse_prompt(prompt)
    right = demo.render_response(problem, "polite", problem.answer)
    wrong = demo.render_response(problem, "polite", problem.answer + 1)
    assert default_score(prompt, right) == demo.true_reward(prompt, right)
    assert default_score(prompt, right) > default_score(prompt, wrong)


def test_other_prompts_are_scored_by_the_answers_latent_quality():
    answer = "Paris is the capital of France."
    assert default_score("Name a capital city.", answer) == hidden_quality(answer)
