/* A C99 program built against an installed libgift, as its users build theirs
 * (test_install.sh): gift.h must compile as C, and an encode-decode round trip must work
 * through the shared library alone. */
#include <gift/gift.h>
#include <stdio.h>
#include <string.h>

#define ROWS 2
#define COLS 128

static int fail(const char* what, giftResult_t r) {
  fprintf(stderr, "consumer: %s: %s (%s)\n", what, giftGetErrorString(r),
          giftGetLastErrorMessage());
  return 1;
}

int main(void) {
  float src[ROWS * COLS], back[ROWS * COLS], scales[ROWS];
  uint8_t codes[ROWS * COLS];
  giftQuantParams p = GIFT_QUANT_PARAMS_INIT;
  giftQuantParams unset;
  uint64_t scale_bytes = 0;
  giftResult_t r;
  int i;

  if (giftVersionNumber() != GIFT_VERSION_NUMBER) {
    fprintf(stderr, "consumer: library version %u, header version %u\n", giftVersionNumber(),
            (unsigned)GIFT_VERSION_NUMBER);
    return 1;
  }
  /* Each row's largest magnitude is 448, E4M3's maximum, so its scale is 1 and the small
   * integers elsewhere are exact in E4M3: the round trip must return every value. */
  for (i = 0; i < ROWS * COLS; ++i) src[i] = (float)(i % 33 - 16);
  src[0] = 448.0f;
  src[COLS] = -448.0f;

  /* A struct that did not start from its initializer is refused by name, not misread. */
  memset(&unset, 0, sizeof unset);
  r = giftQuantParamsValidate(&unset);
  if (r != GIFT_ERROR_INVALID_ARGUMENT) return fail("an uninitialized giftQuantParams", r);
  r = giftScaleBytes(&p, ROWS, COLS, &scale_bytes);
  if (r != GIFT_OK) return fail("giftScaleBytes", r);
  if (scale_bytes != sizeof scales) {
    fprintf(stderr, "consumer: %u scale bytes, expected %u\n", (unsigned)scale_bytes,
            (unsigned)sizeof scales);
    return 1;
  }
  r = giftEncode(NULL, &p, src, GIFT_DTYPE_F32, ROWS, COLS, codes, scales, sizeof scales, NULL);
  if (r != GIFT_OK) return fail("giftEncode", r);
  r = giftDecode(NULL, &p, codes, scales, sizeof scales, ROWS, COLS, back, GIFT_DTYPE_F32);
  if (r != GIFT_OK) return fail("giftDecode", r);
  if (memcmp(src, back, sizeof src) != 0) {
    fprintf(stderr, "consumer: the round trip changed values\n");
    return 1;
  }

  /* Errors come back as codes with a name and a message, not as a crash. */
  r = giftEncode(NULL, &p, src, GIFT_DTYPE_F32, ROWS, COLS, codes, scales, 1, NULL);
  if (r != GIFT_ERROR_BUFFER_TOO_SMALL || strcmp(giftGetErrorString(r), "") == 0) {
    fprintf(stderr, "consumer: a short scale buffer gave %d (%s)\n", (int)r, giftGetErrorString(r));
    return 1;
  }
  printf("consumer: libgift %u, GIFT format %d.%d: round trip exact\n", giftVersionNumber(),
         GIFT_FORMAT_MAJOR, GIFT_FORMAT_MINOR);
  return 0;
}
