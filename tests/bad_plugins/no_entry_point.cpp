// A shared library that is not a normlab plugin: it exports a function, but no entry points.
extern "C" __attribute__((visibility("default"))) int some_other_library_function() { return 42; }
