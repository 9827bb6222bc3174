# Compile-only builds of reg16.cu (the RS form with staged index entries, NoPE and shim) for
# each target, no GPU needed; one ptxas report per target and form.
for arch in sm_90a sm_100a sm_120a sm_89; do
  for v in "-DRS -DIDX_SMEM=2208" "-DRS -DIDX_SMEM=2208 -DROPE"; do
    tag=$(echo "$arch $v" | tr -d ' =-')
    nvcc -O3 -std=c++17 -arch=$arch -shared -Xcompiler -fPIC -Xptxas -v $v -o /tmp/x.so ../reg16.cu > $tag.txt 2>&1
  done
done
