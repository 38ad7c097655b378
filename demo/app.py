"""`python demo/app.py [options]` is `dspark demo [options]`: the Gradio demo on 127.0.0.1."""

import argparse

from dspark_hf import demo_app

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="demo/app.py", description="DSpark Gradio demo: watch every drafting round")
    demo_app.add_arguments(parser)
    arguments = parser.parse_args()
    arguments.func(arguments)
