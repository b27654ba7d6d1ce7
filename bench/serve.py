"""`python -m bench.serve run app.py [streamlit options]`: the app as `streamlit run` starts
it, after core.device.keep_freed_memory() -- how the app runs once app.py (or
viz/ui/models.py, beside configure_threads) calls it. The browser benchmark starts the
server this way unless told --no-keep-freed-memory."""

import sys

import core.device

if __name__ == "__main__":
    core.device.keep_freed_memory()
    from streamlit.web.cli import main

    sys.exit(main(prog_name="streamlit"))
