"""The exception every failing libgift call raises (kept apart so the binding can import it)."""

# giftResult_t (gift.h) by code.
_NAMES = {
    1: "GIFT_ERROR_INVALID_ARGUMENT", 2: "GIFT_ERROR_NONFINITE_INPUT",
    3: "GIFT_ERROR_BUFFER_TOO_SMALL", 4: "GIFT_ERROR_OUT_OF_MEMORY", 5: "GIFT_ERROR_INTERNAL",
    6: "GIFT_ERROR_IO", 7: "GIFT_ERROR_CORRUPT_INPUT", 10: "GIFT_ERROR_FRAME_MAGIC",
    11: "GIFT_ERROR_FRAME_VERSION", 12: "GIFT_ERROR_FRAME_TRUNCATED",
    13: "GIFT_ERROR_HEADER_CHECKSUM", 14: "GIFT_ERROR_HEADER_INVALID",
    15: "GIFT_ERROR_FIELD_INVALID", 16: "GIFT_ERROR_SECTION_BOUNDS",
    17: "GIFT_ERROR_SECTION_ALIGNMENT", 18: "GIFT_ERROR_SECTION_LENGTH",
    19: "GIFT_ERROR_SECTION_CHECKSUM", 20: "GIFT_ERROR_DECOMPRESSION", 21: "GIFT_ERROR_NOT_FOUND",
    22: "GIFT_ERROR_BASIS_MISSING", 23: "GIFT_ERROR_DEVICE", 24: "GIFT_ERROR_REMOTE",
}


class GiftError(RuntimeError):
    """A libgift call failed: `code` is its giftResult_t and `name` that code's name in gift.h,
    `description` the library's words for the code (giftGetErrorString) and `message` the
    detail of the failure (giftGetLastErrorMessage)."""

    def __init__(self, code, description, message):
        super().__init__(f"{message} ({description})" if message else description)
        self.code = code
        self.name = _NAMES.get(code, f"giftResult_t {code}")
        self.description = description
        self.message = message

    def __reduce__(self):
        return (type(self), (self.code, self.description, self.message))
