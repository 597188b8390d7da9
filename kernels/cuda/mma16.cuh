// mma16.cuh — the warp-level 16-bit tensor-core primitives of the fused
// attention kernels (flash_mma.cu, gqa_mma.cu): mma.sync m16n8k16 with fp32
// accumulators, ldmatrix, cp.async, and the two-wide float atomic add.
//
// Under GRADD_CUDA_EMU (tests/emu) each one is its emulation from the PTX
// ISA (cuda_emu.h), so the kernels' fragment plumbing runs on the CPU.
//
// Included after kern_cuda.cuh or cuda_emu.h, and after tile16.cuh
// (kc_pack2).
#pragma once


// d += a·b, one 16×8×16 tile, fp32 accumulate.
template <class E>
__device__ __forceinline__ void m16_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void m16_mma<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
#ifdef GRADD_CUDA_EMU
    emu_mma_m16n8k16<__nv_bfloat16>(d, a, b0, b1);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
template <>
__device__ __forceinline__ void m16_mma<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
#ifdef GRADD_CUDA_EMU
    emu_mma_m16n8k16<__half>(d, a, b0, b1);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

template <bool TRANS> __device__ __forceinline__ void m16_ldm(uint32_t (&r)[4], const void *p)
{
#ifdef GRADD_CUDA_EMU
    emu_ldmatrix_x4(r, p, TRANS); // the pointer itself: a 32-bit shared address means nothing on the host
#else
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#endif
}

// ---- cp.async: a 16-bit tile copied to shared memory without registers ----------------------
// With a 16-bit source (S == E) staging is a plain copy, so it can run
// behind the math: cp.async moves 16 bytes from global to shared memory
// asynchronously, in commit groups a thread waits for (PTX ISA, sm_80+).
// The kernels issue the next tile's copies before the work that does not
// read its buffer, and wait for them just before the barrier that hands
// the buffer over.  valid false: the 16 bytes are zeros (src-size 0).
__device__ __forceinline__ void m16_cp16(void *smem, const void *gmem, bool valid)
{
#ifdef GRADD_CUDA_EMU
    emu_cp_async16(smem, gmem, valid ? 16 : 0);
#else
    uint32_t d = (uint32_t)__cvta_generic_to_shared(smem);
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(gmem), "r"(n) : "memory");
#endif
}

__device__ __forceinline__ void m16_cp_commit()
{
#ifdef GRADD_CUDA_EMU
    emu_cp_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Wait until at most N of this thread's newest commit groups are pending.
template <int N> __device__ __forceinline__ void m16_cp_wait()
{
#ifdef GRADD_CUDA_EMU
    emu_cp_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// p[0] += x, p[1] += y atomically, p 8-byte aligned.  sm_90 has a two-wide
// float atomic: half the atomic operations of dQ's summation, the
// backward's only traffic to global memory inside its loop.  (Each element
// is still its own atomic add: the order of summation is as unfixed as
// before.)  The emulation and the compute_80 PTX take the scalar form.
__device__ __forceinline__ void m16_atomic_add2(float *p, float x, float y)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2 *>(p), make_float2(x, y));
#else
    atomicAdd(p, x);
    atomicAdd(p + 1, y);
#endif
}

// The A fragment over k = 16·kk.. of a 16-row band whose fp32 values sit in
// accumulator tiles t[2kk] and t[2kk+1].
template <class E> __device__ __forceinline__ void m16_acc_to_a(uint32_t (&a)[4], const float (&t0)[4], const float (&t1)[4])
{
    a[0] = kc_pack2<E>(t0[0], t0[1]);
    a[1] = kc_pack2<E>(t0[2], t0[3]);
    a[2] = kc_pack2<E>(t1[0], t1[1]);
    a[3] = kc_pack2<E>(t1[2], t1[3]);
}

// An A fragment back into shared memory: p is where lane (g, c)'s first
// word goes (row g, column 2c of the 16×16 block), rows ld apart; it holds
// rows g and g+8, columns 2c.. and 2c+8.., exactly the words to store.
template <class E> __device__ __forceinline__ void m16_store_a(E *p, int ld, const uint32_t (&a)[4])
{
    E *r1 = p + 8 * ld;
    *reinterpret_cast<uint32_t *>(p) = a[0];
    *reinterpret_cast<uint32_t *>(r1) = a[1];
    *reinterpret_cast<uint32_t *>(p + 8) = a[2];
    *reinterpret_cast<uint32_t *>(r1 + 8) = a[3];
}

// The online softmax's step for the two rows (g and g+8) a lane holds of an
// accumulator tile band: mx, the lane's maxima of the block's scores (log2
// units), becomes its quad's, the rows' maxima; the running maxima m move
// to include them and this lane's running sums l are rescaled to match.
// mu is what to subtract from the block's scores before exp2 (0 for a row
// with nothing unmasked yet), alpha what scaled the earlier sums (for the
// output accumulators too).
__device__ __forceinline__ void m16_softmax_rescale(float (&mx)[2], float (&m)[2], float (&l)[2], float (&mu)[2],
                                                    float (&alpha)[2])
{
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
        mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
        const float mn = fmaxf(m[hr], mx[hr]);
        mu[hr] = mn == -INFINITY ? 0.0f : mn;
        alpha[hr] = exp2f(m[hr] - mu[hr]);
        m[hr] = mn;
        l[hr] *= alpha[hr];
    }
}
