#!/bin/sh
# Runs a Python test that loads libxpack.so through ctypes when libxpack is built
# with sanitizers. The interpreter itself is not instrumented, so the sanitizer
# runtime must be loaded before it starts: ASan and TSan refuse (or crash) when
# they only arrive through dlopen of libxpack.so.
#
# usage: sanitized_python.sh B_SANITIZE RUNTIME_SO PYTHON SCRIPT [ARGS...]
#   B_SANITIZE  Meson's b_sanitize value (none, address, address,undefined, thread, ...)
#   RUNTIME_SO  the sanitizer runtime found at configure time ('' when none is needed)
# Exit 77 (Meson's SKIP) with a message when the run cannot be made to work.
set -eu
sanitize=$1
runtime=$2
shift 2

case ",$sanitize," in
  *,memory,*)
    # MSan needs every byte it sees initialised by instrumented code; CPython is not.
    echo "SKIP: libxpack is built with -fsanitize=memory; an uninstrumented Python cannot load it"
    exit 77 ;;
  *,address,*|*,thread,*) ;;
  *) exec "$@" ;;  # none, or UBSan alone: its runtime may arrive through dlopen
esac

if [ -z "$runtime" ] || [ ! -f "$runtime" ]; then
  echo "SKIP: libxpack is built with -fsanitize=$sanitize but its runtime library" \
       "('$runtime') was not found at configure time, so Python cannot load libxpack.so"
  exit 77
fi

# PYTHON may be a launcher script (pyenv's shim is bash); an uninstrumented bash
# crashes with libtsan preloaded, so ask the launcher for the interpreter first.
python=$("$1" -c 'import sys; print(sys.executable)')
shift
set -- "$python" "$@"

LD_PRELOAD="$runtime${LD_PRELOAD:+:$LD_PRELOAD}"
export LD_PRELOAD
case ",$sanitize," in
  *,address,*)
    # CPython keeps its interned objects and arenas until exit on purpose; a leak
    # report would be about the interpreter, not libxpack. Errors still halt.
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    export ASAN_OPTIONS ;;
esac
echo "sanitized_python: $python with LD_PRELOAD=$LD_PRELOAD ASAN_OPTIONS=${ASAN_OPTIONS:-} TSAN_OPTIONS=${TSAN_OPTIONS:-}"
exec "$@"
