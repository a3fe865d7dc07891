// cxx_new_delete.cpp: C++ operators new and delete in all their forms, ROUNDS times each,
// with sizes chosen so the trace's calls can be found by size: new/delete of 72 bytes,
// new[]/delete[] of 1000, over-aligned new/delete of 128 bytes aligned to 64 (aligned
// new[] too), nothrow new of 88, and a new[] too large to succeed, which must throw
// std::bad_alloc. Exits 0.  usage: cxx_new_delete [rounds=100]
#include <cstdio>
#include <cstdlib>
#include <new>

struct Plain {
    char bytes[72];
};
struct alignas(64) Aligned {
    char bytes[128];
};
struct Nothrow {
    char bytes[88];
};

// Stores the compiler cannot see through, so it keeps every new and delete.
static Plain *volatile plain_sink;
static char *volatile array_sink;
static Aligned *volatile aligned_sink;
static Aligned *volatile aligned_array_sink;
static Nothrow *volatile nothrow_sink;
static volatile size_t too_many = static_cast<size_t>(-1) / 4;

int main(int argc, char **argv) {
    int rounds = argc > 1 ? std::atoi(argv[1]) : 100;
    for (int i = 0; i < rounds; i++) {
        plain_sink = new Plain;
        delete plain_sink;
        array_sink = new char[1000];
        delete[] array_sink;
        aligned_sink = new Aligned;
        if (reinterpret_cast<size_t>(aligned_sink) % 64 != 0) return 3;
        delete aligned_sink;
        aligned_array_sink = new Aligned[2];
        if (reinterpret_cast<size_t>(aligned_array_sink) % 64 != 0) return 4;
        delete[] aligned_array_sink;
        nothrow_sink = new (std::nothrow) Nothrow;
        if (!nothrow_sink) return 5;
        delete nothrow_sink;
    }
    try {
        array_sink = new char[too_many];
        return 6;
    } catch (const std::bad_alloc &) {
    }
    // The thread must go on being recorded after an exception left operator new.
    plain_sink = new Plain;
    delete plain_sink;
    return 0;
}
