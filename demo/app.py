"""`python demo/app.py [options]` is `dspark demo [options]`: the Gradio demo on 127.0.0.1."""

import argparse

from dspark_hf.tools import demo

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="demo/app.py", description="DSpark Gradio demo: watch every drafting round")
    demo.add_arguments(parser)
    arguments = parser.parse_args()
    arguments.func(arguments)
