// Linked into executables of the debug (sanitizer) preset only. Open MPI and
// its plugins leave allocations for the OS to reclaim at exit, which
// LeakSanitizer reports by the thousand; the address and undefined-behaviour
// checks stay on.
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }
