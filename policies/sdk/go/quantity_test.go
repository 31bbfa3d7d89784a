package sdk

import "testing"

func TestParseQuantity(t *testing.T) {
	for in, want := range map[string]int64{
		"2": 2000, "500m": 500, "128Mi": 128 << 20 * 1000, "1Ki": 1024000, "1k": 1000000, "1.5": 1500,
		"1e3": 1000000, "1.5G": 1500000000000, "100n": 1, "-1": -1000, "0": 0, " 3 ": 3000, "4Ei": 0,
	} {
		got, err := ParseQuantity(in)
		if in == "4Ei" {
			if err == nil {
				t.Errorf("%q: no error for an overflow", in)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("ParseQuantity(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "1x", "Mi", "1 Mi", "+-1", "1e99"} {
		if v, err := ParseQuantity(in); err == nil {
			t.Errorf("ParseQuantity(%q) = %d, want an error", in, v)
		}
	}
}

// The integer fast path agrees with the exact parse wherever it answers.
func TestParseIntQuantityMatchesRat(t *testing.T) {
	for _, in := range []string{"0", "1", "-1", "7", "500m", "-500m", "128Mi", "3800Mi", "64Ki", "2Gi", "1Ti", "3Pi", "7Ei",
		"12k", "5M", "9G", "2T", "8P", "1E", "9223372036854775807", "9223372036854775807m", "9223372036854Mi", "+5", "05"} {
		fast, ok := parseIntQuantity(in)
		exact, err := parseRatQuantity(in)
		if ok && (err != nil || fast != exact) {
			t.Errorf("%q: fast %d, exact %d (%v)", in, fast, exact, err)
		}
	}
}
