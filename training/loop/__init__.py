"""Close the loop: export -> train -> evaluate -> generate -> open the next round.

`settings` holds a project's loop policy, `mining` the choice of the next round's prompts
(hard-example strategies registered by mode name), `steps` one iteration's steps and
`schedule` its beat schedule. The names callers use are importable from here.
"""

from training.loop.mining import (
    HARD_MINING_MODES,
    MINING_STRATEGIES,
    MiningStrategy,
    mining_strategy,
    prompts_select,
    reward_model_trained_on_chat,
    reward_models_newest,
)
from training.loop.schedule import (
    LOOP_TASK,
    loop_schedule_pause,
    loop_schedule_paused,
    loop_schedule_set,
)
from training.loop.settings import DPO_DEFAULTS, PPO_DEFAULTS, REWARD_DEFAULTS, LoopSettings
from training.loop.steps import (
    LoopState,
    Step,
    loop_advance,
    loop_key,
    loop_ready,
)
from training.rounds import generate_round_now, round_generate

__all__ = [
    "DPO_DEFAULTS",
    "HARD_MINING_MODES",
    "LOOP_TASK",
    "MINING_STRATEGIES",
    "PPO_DEFAULTS",
    "REWARD_DEFAULTS",
    "LoopSettings",
    "LoopState",
    "MiningStrategy",
    "Step",
    "generate_round_now",
    "loop_advance",
    "loop_key",
    "loop_ready",
    "loop_schedule_pause",
    "loop_schedule_paused",
    "loop_schedule_set",
    "mining_strategy",
    "prompts_select",
    "reward_model_trained_on_chat",
    "reward_models_newest",
    "round_generate",
]
