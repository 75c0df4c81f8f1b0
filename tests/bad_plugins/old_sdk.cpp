// A plugin as the SDK before ABI 2 built it: the old metadata symbol, no .normlab_plugin section.
extern "C" __attribute__((visibility("default"))) const int normlab_plugin_info = 1;
extern "C" __attribute__((visibility("default"))) int normlab_create_scheme() { return 0; }
