"""`python demo/app.py [options]` is `dspark demo [options]`: the Gradio demo on 127.0.0.1."""

import argparse
import sys

from dspark_hf.tools import demo
from dspark_hf.tools.errors import USER_ERRORS

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="demo/app.py", description="DSpark Gradio demo: watch every drafting round")
    demo.add_arguments(parser)
    arguments = parser.parse_args()
    try:
        arguments.func(arguments)
    except USER_ERRORS as error:  # a busy port or a bad path: one line, as `dspark demo` prints it
        sys.exit(f"demo/app.py: error: {error}")
