package sdk

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"math/big"
	"strconv"
	"strings"
	"sync"
)

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// ParseQuantity parses a Kubernetes quantity ("500m", "2", "128Mi", "1e3",
// "1.5G") and returns its value in thousandths: ParseQuantity("500m") is 500,
// ParseQuantity("1Ki") is 1024000. CPU in millicores is MilliValue; memory in
// bytes is MilliValue/1000.
func ParseQuantity(s string) (milli int64, err error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, fmt.Errorf("empty quantity")
	}
	if v, ok := parseIntQuantity(s); ok {
		return v, nil
	}
	return parseRatQuantity(s)
}

// parseRatQuantity parses any quantity exactly, with big numbers.
func parseRatQuantity(s string) (milli int64, err error) {
	num := s
	mult := new(big.Rat).SetInt64(1)
	for _, sf := range quantitySuffixes() {
		if strings.HasSuffix(s, sf.s) {
			num, mult = strings.TrimSuffix(s, sf.s), sf.m
			break
		}
	}
	if i := strings.IndexAny(num, "eE"); i >= 0 && num == s {
		exp := num[i+1:]
		num = num[:i]
		var e int
		if _, err := fmt.Sscanf(exp, "%d", &e); err != nil || e < -18 || e > 18 {
			return 0, fmt.Errorf("quantity %q: bad exponent", s)
		}
		if e >= 0 {
			mult = ratPow(10, e)
		} else {
			mult = new(big.Rat).Inv(ratPow(10, -e))
		}
	}
	if num == "" || strings.ContainsAny(num, " _") {
		return 0, fmt.Errorf("quantity %q: no number", s)
	}
	v, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Errorf("quantity %q: not a number", s)
	}
	v.Mul(v, mult)
	v.Mul(v, big.NewRat(1000, 1))
	// Round up, as Kubernetes does for MilliValue.
	q, r := new(big.Int).QuoRem(v.Num(), v.Denom(), new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() || q.Int64() == math.MinInt64 {
		return 0, fmt.Errorf("quantity %q: out of range", s)
	}
	return q.Int64(), nil
}

// quantitySuffixes are the multipliers of the suffixes, built once: they
// cost more than the parse itself.
var quantitySuffixes = sync.OnceValue(func() []quantitySuffix {
	return []quantitySuffix{
		{"Ki", ratPow(2, 10), 1 << 10 * 1000}, {"Mi", ratPow(2, 20), 1 << 20 * 1000}, {"Gi", ratPow(2, 30), 1 << 30 * 1000},
		{"Ti", ratPow(2, 40), 1 << 40 * 1000}, {"Pi", ratPow(2, 50), 1 << 50 * 1000}, {"Ei", ratPow(2, 60), 0},
		{"n", big.NewRat(1, 1e9), 0}, {"u", big.NewRat(1, 1e6), 0}, {"m", big.NewRat(1, 1e3), 1},
		{"k", ratPow(10, 3), 1e6}, {"M", ratPow(10, 6), 1e9}, {"G", ratPow(10, 9), 1e12},
		{"T", ratPow(10, 12), 1e15}, {"P", ratPow(10, 15), 1e18}, {"E", ratPow(10, 18), 0},
	}
})

type quantitySuffix struct {
	s string
	m *big.Rat
	// milli is the multiplier in thousandths if it fits an int64, else 0.
	milli int64
}

// parseIntQuantity is the common case without big numbers: an integer
// with an optional suffix ("2", "500m", "128Mi"). It reports false for
// anything else (decimals, exponents, n and u, overflow), which ParseQuantity
// then parses exactly.
func parseIntQuantity(s string) (int64, bool) {
	num, mult := s, int64(1000)
	if c := s[len(s)-1]; c < '0' || c > '9' {
		mult = 0
		for _, sf := range quantitySuffixes() {
			if strings.HasSuffix(s, sf.s) {
				num, mult = s[:len(s)-len(sf.s)], sf.milli
				break
			}
		}
	}
	if mult == 0 || num == "" || num[0] == '+' {
		return 0, false
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n > math.MaxInt64/mult || n < -math.MaxInt64/mult {
		return 0, false
	}
	return n * mult, true
}

func ratPow(base, exp int) *big.Rat {
	return new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(int64(base)), big.NewInt(int64(exp)), nil))
}
