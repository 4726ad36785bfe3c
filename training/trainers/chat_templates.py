"""Chat templates and the tokenizer fix-ups every recipe applies before training.

A tokenizer that comes without a chat template gets HH-RLHF's plain-text layout, so a
conversational snapshot trains on any encoder or decoder.
"""

from __future__ import annotations

# The assistant turn, including the eos that ends it, sits inside {% generation %} so that
# SFT's assistant-only loss trains the model to stop; every earlier turn renders the same
# whatever follows it, so DPO's prompt / prompt+completion split is a clean token prefix.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>' }}{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

# For tokenizers without role tokens (e.g. BERT): HH-RLHF's plain-text dialogue layout.
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '\n\nAssistant: ' }}{% generation %}{{ message['content'] }}{% endgeneration %}"
    "{% elif message['role'] == 'system' %}"
    "{{ message['content'] }}"
    "{% else %}"
    "{{ '\n\nHuman: ' + message['content'] }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '\n\nAssistant:' }}{% endif %}"
)

MINILM_EOS_TOKEN = "[SEP]"  # BERT has no eos; its separator closes every sequence instead


def prepare_tokenizer(tokenizer):
    """Give a tokenizer what the recipes need: an eos, a pad token and a chat template."""
    if tokenizer.eos_token is None and MINILM_EOS_TOKEN in tokenizer.get_vocab():
        tokenizer.eos_token = MINILM_EOS_TOKEN
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    return tokenizer
