// Package hostile holds inputs that attack parsers, for the tests and fuzz seeds of every
// package that reads a file an attacker may have written (static manifests, the
// configuration, policies.yaml).
package hostile

// YAMLAliasBomb returns header followed by CVE-2019-11253's "billion laughs": nine levels of
// anchors, each aliasing the one before nine times, 9^9 strings from under 1 KiB of YAML. header
// holds the lines that make it a document of the kind the parser under test expects.
func YAMLAliasBomb(header string) string {
	return header + `a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
`
}
