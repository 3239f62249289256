// Linked once per toolchain with -fuse-ld=gold (emmy.cuda.emulate.run.linker_flags): gold is
// used for the emulator's programs only where it links one that needs libstdc++.
#include <vector>

int main() {
    std::vector<int> v(3, 1);
    return v[0] + v[1] + v[2] == 3 ? 0 : 1;
}
