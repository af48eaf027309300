/* The AVX2 int8 ceiling: one 1536 x 384 matrix in 8-row tiles times 64 tokens, exact int32 sums, one thread's CPU
 * time (best of 15): int8 values by the sign trick (|w| maddubs x with w's sign, madd, add: encoder_i8.c's inner
 * loop) against int16 operands (vpmaddwd on weights widened in registers, activations stored as int16). Checks the
 * sums against plain C. Build and run: gcc -O2 -o /tmp/int8_ceiling bench/int8_ceiling.c && /tmp/int8_ceiling */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#define COLS 384
#define ROWS 1536
#define NTOK 64
static double cpu(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
__attribute__((target("avx2"))) static void k8(const int8_t *w, const int8_t *x, int32_t *out) {
  const __m256i ones=_mm256_set1_epi16(1);
  for (int tile=0; tile<ROWS/8; tile++) { const int8_t *tw=w+(size_t)tile*8*COLS;
    for (int t0=0;t0<NTOK;t0+=8){ __m256i acc[8]; for(int k=0;k<8;k++)acc[k]=_mm256_setzero_si256();
      for(int j=0;j<COLS/4;j++){ __m256i wv=_mm256_load_si256((const __m256i*)(tw+32*j)), aw=_mm256_sign_epi8(wv,wv);
        for(int k=0;k<8;k++){int32_t x4; memcpy(&x4,x+(size_t)(t0+k)*COLS+4*j,4);
          acc[k]=_mm256_add_epi32(acc[k],_mm256_madd_epi16(_mm256_maddubs_epi16(aw,_mm256_sign_epi8(_mm256_set1_epi32(x4),wv)),ones));}}
      for(int k=0;k<8;k++)_mm256_storeu_si256((__m256i*)(out+((size_t)(t0+k)*ROWS+tile*8)),acc[k]);}}
}
__attribute__((target("avx2"))) static void k16(const int8_t *w, const int16_t *x, int32_t *out) {
  for (int tile=0; tile<ROWS/8; tile++) { const int8_t *tw=w+(size_t)tile*8*COLS;
    for (int t0=0;t0<NTOK;t0+=4){ __m256i lo[4],hi[4]; for(int k=0;k<4;k++)lo[k]=hi[k]=_mm256_setzero_si256();
      for(int j=0;j<COLS/4;j++){ __m256i w0=_mm256_cvtepi8_epi16(_mm_load_si128((const __m128i*)(tw+32*j))), w1=_mm256_cvtepi8_epi16(_mm_load_si128((const __m128i*)(tw+32*j+16)));
        for(int k=0;k<4;k++){int64_t x4; memcpy(&x4,x+(size_t)(t0+k)*COLS+4*j,8); __m256i xv=_mm256_set1_epi64x(x4);
          lo[k]=_mm256_add_epi32(lo[k],_mm256_madd_epi16(w0,xv)); hi[k]=_mm256_add_epi32(hi[k],_mm256_madd_epi16(w1,xv));}}
      for(int k=0;k<4;k++){__m256i h=_mm256_permutevar8x32_epi32(_mm256_hadd_epi32(lo[k],hi[k]),_mm256_setr_epi32(0,1,4,5,2,3,6,7));
        _mm256_storeu_si256((__m256i*)(out+((size_t)(t0+k)*ROWS+tile*8)),h);}}}
}
int main(void){
  int8_t *w=aligned_alloc(64,ROWS*COLS), *x8=aligned_alloc(64,NTOK*COLS); int16_t *x16=aligned_alloc(64,2*NTOK*COLS);
  int32_t *o8=aligned_alloc(64,4*NTOK*ROWS), *o16=aligned_alloc(64,4*NTOK*ROWS);
  srand(1); int8_t wr[ROWS][COLS];
  for(int r=0;r<ROWS;r++)for(int c=0;c<COLS;c++){wr[r][c]=(int8_t)(rand()%255-127);}
  for(int r=0;r<ROWS;r++)for(int c=0;c<COLS;c++) w[(size_t)(r/8)*8*COLS+(c/4)*32+4*(r%8)+c%4]=wr[r][c];
  for(int i=0;i<NTOK*COLS;i++){x8[i]=(int8_t)(rand()%255-127); x16[i]=x8[i];}
  double best8=1e9,best16=1e9;
  for(int it=0;it<15;it++){ double t=cpu(); k8(w,x8,o8); t=cpu()-t; if(t<best8)best8=t;
    t=cpu(); k16(w,x16,o16); t=cpu()-t; if(t<best16)best16=t;}
  long bad=0; for(int t=0;t<NTOK;t++)for(int r=0;r<ROWS;r++){long s=0; for(int c=0;c<COLS;c++)s+=wr[r][c]*x8[t*COLS+c]; bad+=(s!=o8[t*ROWS+r])+(s!=o16[t*ROWS+r]);}
  double macs=(double)ROWS*COLS*NTOK;
  printf("mismatches %ld\nint8 sign trick: %.2f ms, %.1f GMAC/s\nint16 madd:      %.2f ms, %.1f GMAC/s\n",bad,best8*1e3,macs/best8/1e9,best16*1e3,macs/best16/1e9);
}
