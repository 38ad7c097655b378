"""DSpark speculative decoding for Hugging Face transformers.

    drafter = DSparkDrafter.from_pretrained("deepseek-ai/dspark_qwen3_4b_block7", target)
    target.generate(**inputs, assistant_model=drafter)
"""

from .config import CheckpointError, DSparkConfig
from .generation import DSparkCandidateGenerator
from .modeling import DSparkDrafter
from .trace import RoundRecord, TraceSummary, summarize

__all__ = [
    "CheckpointError",
    "DSparkCandidateGenerator",
    "DSparkConfig",
    "DSparkDrafter",
    "RoundRecord",
    "TraceSummary",
    "summarize",
]
__version__ = "0.1.0"
