"""DSpark drafting through transformers' `custom_generate` convention.

    import os, dspark_hf
    target.generate(**inputs, assistant_model=drafter, trust_remote_code=True,
                    custom_generate=os.path.dirname(dspark_hf.__file__))

transformers loads this file from the folder's `custom_generate/` and calls
`generate(model, ...)` with generate()'s own arguments. It routes the model's assisted
decoding to DSpark drafting, as `DSparkDrafter.from_pretrained` does for its target,
then runs transformers' generate: a target loaded elsewhere, or a drafter built by
hand, needs no other step. transformers picks the assisted loop's candidate generator
in a private method with no public hook, so the routing still goes through it.
"""

from transformers import GenerationMixin

from dspark_hf.core.generation import attach_to_target


def generate(model, *args, **kwargs):
    attach_to_target(model)
    # The class's generate: a model loaded with a custom_generate of its own has `generate` replaced by it.
    return GenerationMixin.generate(model, *args, **kwargs)
