package sdk

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"math/big"
	"strings"
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
	num := s
	mult := new(big.Rat).SetInt64(1)
	suffixes := []struct {
		s string
		m *big.Rat
	}{
		{"Ki", ratPow(2, 10)}, {"Mi", ratPow(2, 20)}, {"Gi", ratPow(2, 30)},
		{"Ti", ratPow(2, 40)}, {"Pi", ratPow(2, 50)}, {"Ei", ratPow(2, 60)},
		{"n", big.NewRat(1, 1e9)}, {"u", big.NewRat(1, 1e6)}, {"m", big.NewRat(1, 1e3)},
		{"k", ratPow(10, 3)}, {"M", ratPow(10, 6)}, {"G", ratPow(10, 9)},
		{"T", ratPow(10, 12)}, {"P", ratPow(10, 15)}, {"E", ratPow(10, 18)},
	}
	for _, sf := range suffixes {
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

func ratPow(base, exp int) *big.Rat {
	return new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(int64(base)), big.NewInt(int64(exp)), nil))
}
