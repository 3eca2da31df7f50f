# Included by install.sh's build of llama-cpp-python, at the end of llama.cpp's own project() call
# (CMAKE_PROJECT_llama.cpp_INCLUDE). llama-cpp-python forces llama.cpp's "common" library on, though the
# Python package loads only libllama and the ggml libraries; that library is about half of the compile
# time. A normal variable shadows the forced cache entry inside llama.cpp's directory, so it is skipped.
set(LLAMA_BUILD_COMMON OFF)
