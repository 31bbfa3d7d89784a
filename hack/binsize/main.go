// Command binsize shows where a Go binary's bytes go: it reads the symbol table of an
// unstripped ELF build and sums the symbols' sizes per module and per package, split by the
// section they live in. hack/binsize.sh builds the firmware binary both ways (stripped, as
// hack/firmware.sh ships it, and unstripped for this) and writes the table under docs/runs/.
//
//	go list -deps -f '{{.ImportPath}} {{with .Module}}{{.Path}}{{else}}std{{end}}' ./cmd/holdfast > pkgs
//	go run ./hack/binsize -bin holdfast-unstripped -pkgs pkgs [-stripped holdfast] [-top 60]
//
// What is measured: every symbol of .text (code), .rodata/.typelink/.itablink (constants, type
// descriptors, strings) and .data/.noptrdata (initialized variables) is attributed to the
// package its name starts with (longest match against the package list, so "gopkg.in/inf.v0"
// and "type:*k8s.io/api/core/v1.Pod" land where they belong; an itab goes to its concrete
// type's package). Two things cannot be read from names: .gopclntab, the runtime's function
// table (names, PC-to-line and stack maps, about as large as the code again), and the
// funcdata symbols go:func.* in .rodata. Both grow with the code, so the "est. stripped" column
// spreads them over the packages in proportion to their code; the "measured" column is what the
// symbols alone say. .bss/.noptrbss take no space in the file and are shown apart.
package main

import (
	"bufio"
	"debug/dwarf"
	"debug/elf"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

func main() { os.Exit(doMain(os.Args[1:], os.Stdout, os.Stderr)) }

// class is where a symbol's bytes are in the file.
type class int

const (
	text   class = iota // .text
	rodata              // .rodata, .typelink, .itablink
	data                // .data, .noptrdata
	pcln                // .gopclntab
	bss                 // .bss, .noptrbss: not in the file
	other               // anything else (notes, buildinfo)
	nclass
)

func sectionClass(name string) class {
	switch name {
	case ".text":
		return text
	case ".rodata", ".typelink", ".itablink":
		return rodata
	case ".data", ".noptrdata":
		return data
	case ".gopclntab":
		return pcln
	case ".bss", ".noptrbss":
		return bss
	}
	return other
}

type sizes [nclass]int64

func (s *sizes) add(o sizes) {
	for i := range s {
		s[i] += o[i]
	}
}

// file is the measured part: text + rodata + data.
func (s sizes) file() int64 { return s[text] + s[rodata] + s[data] }

func doMain(args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("binsize", flag.ContinueOnError)
	flags.SetOutput(stderr)
	binPath := flags.String("bin", "", "unstripped ELF binary to read (required)")
	pkgsPath := flags.String("pkgs", "", `file of "importpath module" lines, from go list -deps (required)`)
	strippedPath := flags.String("stripped", "", "the same binary stripped, for its size (optional)")
	top := flags.Int("top", 60, "packages to list")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if *binPath == "" || *pkgsPath == "" || flags.NArg() != 0 {
		fmt.Fprintln(stderr, "usage: binsize -bin FILE -pkgs FILE [-stripped FILE] [-top N]")
		return 2
	}
	if err := run(stdout, *binPath, *pkgsPath, *strippedPath, *top); err != nil {
		fmt.Fprintf(stderr, "binsize: %v\n", err)
		return 1
	}
	return 0
}

func run(w io.Writer, binPath, pkgsPath, strippedPath string, top int) error {
	moduleOf, err := readPackages(pkgsPath)
	if err != nil {
		return err
	}
	f, err := elf.Open(binPath)
	if err != nil {
		return err
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return fmt.Errorf("%s: %w (build it without -ldflags=-s)", binPath, err)
	}

	var sections sizes
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC != 0 {
			sections[sectionClass(s.Name)] += int64(s.Size)
		}
	}

	perPkg := map[string]*sizes{}
	var unattributed, total sizes // unattributed: symbols of no listed package (go:func.*, runtime tables)
	for _, s := range syms {
		if s.Section == elf.SHN_UNDEF || int(s.Section) >= len(f.Sections) || s.Size == 0 {
			continue
		}
		c := sectionClass(f.Sections[s.Section].Name)
		if c == pcln || c == other {
			continue
		}
		total[c] += int64(s.Size)
		pkg := packageOf(s.Name, moduleOf)
		if pkg == "" {
			unattributed[c] += int64(s.Size)
			continue
		}
		if perPkg[pkg] == nil {
			perPkg[pkg] = &sizes{}
		}
		perPkg[pkg][c] += int64(s.Size)
	}

	// Type descriptors: .rodata holds them in one block from runtime.types, without symbols of
	// their own; DWARF names each with its offset there (DW_AT_go_runtime_type). A descriptor
	// runs to the next one's offset (gaps over 64 KiB are left unattributed).
	typeBytes, err := typeDescriptors(f, syms, moduleOf, perPkg)
	if err != nil {
		return err
	}
	total[rodata] += typeBytes
	unattributed[rodata] += sections[rodata] - total[rodata] // strings, names, unnamed types

	// Spread over the packages by code: pclntab, the unattributed rodata (go:func.*).
	spread := float64(sections[pcln]+unattributed[rodata]+unattributed[text]+unattributed[data]) / float64(total[text]-unattributed[text])
	est := func(s sizes) int64 { return s.file() + int64(float64(s[text])*spread) }

	perMod := map[string]*sizes{}
	pkgCount := map[string]int{}
	for pkg, s := range perPkg {
		m := moduleOf[pkg]
		if perMod[m] == nil {
			perMod[m] = &sizes{}
		}
		perMod[m].add(*s)
		pkgCount[m]++
	}

	fileSize := int64(0)
	if st, err := os.Stat(binPath); err == nil {
		fileSize = st.Size()
	}
	fmt.Fprintf(w, "Sections of the unstripped binary (%s, %s):\n\n", binPath, mib(fileSize))
	fmt.Fprintf(w, "| section | size |\n| --- | ---: |\n")
	fmt.Fprintf(w, "| code (.text) | %s |\n", mib(sections[text]))
	fmt.Fprintf(w, "| read-only data (.rodata, .typelink, .itablink) | %s |\n", mib(sections[rodata]))
	fmt.Fprintf(w, "| function table (.gopclntab) | %s |\n", mib(sections[pcln]))
	fmt.Fprintf(w, "| data (.data, .noptrdata) | %s |\n", mib(sections[data]))
	fmt.Fprintf(w, "| zeroed at start, not in the file (.bss, .noptrbss) | %s |\n", mib(sections[bss]))
	if strippedPath != "" {
		if st, err := os.Stat(strippedPath); err == nil {
			fmt.Fprintf(w, "| **stripped binary as shipped** | **%s** (%d bytes) |\n", mib(st.Size()), st.Size())
		}
	}
	fmt.Fprintf(w, "\n%d packages linked (in the list: %d). Symbols of no package (go:func.*, runtime tables): %s; "+
		"with .gopclntab they are spread over the packages by code (x%.2f of each package's code) in \"est. stripped\".\n\n",
		len(perPkg), len(moduleOf), mib(unattributed.file()), spread)

	fmt.Fprintf(w, "Per module (est. stripped = measured + its share of .gopclntab and go:func.*):\n\n")
	fmt.Fprintf(w, "| module | pkgs | code | rodata | data | measured | est. stripped | share |\n")
	fmt.Fprintf(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	var estTotal int64
	for _, s := range perMod {
		estTotal += est(*s)
	}
	for _, m := range sortedKeys(perMod, est) {
		s := *perMod[m]
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %.1f%% |\n", m, pkgCount[m],
			mib(s[text]), mib(s[rodata]), mib(s[data]), mib(s.file()), mib(est(s)), 100*float64(est(s))/float64(estTotal))
	}
	fmt.Fprintf(w, "| **all** | %d | %s | %s | %s | %s | %s | |\n\n", len(perPkg),
		mib(total[text]-unattributed[text]), mib(total[rodata]-unattributed[rodata]), mib(total[data]-unattributed[data]),
		mib(total.file()-unattributed.file()), mib(estTotal))

	fmt.Fprintf(w, "Top %d packages:\n\n", top)
	fmt.Fprintf(w, "| package | code | rodata | data | measured | est. stripped |\n")
	fmt.Fprintf(w, "| --- | ---: | ---: | ---: | ---: | ---: |\n")
	for i, p := range sortedKeys(perPkg, est) {
		if i == top {
			break
		}
		s := *perPkg[p]
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", p, mib(s[text]), mib(s[rodata]), mib(s[data]), mib(s.file()), mib(est(s)))
	}
	return nil
}

// typeDescriptors adds each type descriptor's size to its package in perPkg and returns the
// bytes attributed.
func typeDescriptors(f *elf.File, syms []elf.Symbol, moduleOf map[string]string, perPkg map[string]*sizes) (int64, error) {
	var base uint64
	for _, s := range syms {
		if s.Name == "runtime.types" {
			base = s.Value
		}
	}
	if base == 0 {
		return 0, fmt.Errorf("no runtime.types symbol")
	}
	d, err := f.DWARF()
	if err != nil {
		return 0, fmt.Errorf("DWARF: %w (build it without -ldflags=-w)", err)
	}
	const attrGoRuntimeType = dwarf.Attr(0x2904)
	type desc struct {
		off  uint64
		name string
	}
	var descs []desc
	seen := map[uint64]bool{}
	r := d.Reader()
	for {
		e, err := r.Next()
		if err != nil {
			return 0, err
		}
		if e == nil {
			break
		}
		off, ok := e.Val(attrGoRuntimeType).(uint64)
		if !ok || seen[off] {
			continue
		}
		seen[off] = true
		name, _ := e.Val(dwarf.AttrName).(string)
		descs = append(descs, desc{off, name})
	}
	sort.Slice(descs, func(i, j int) bool { return descs[i].off < descs[j].off })
	var attributed int64
	for i := 0; i+1 < len(descs); i++ {
		size := int64(descs[i+1].off - descs[i].off)
		if size > 64<<10 {
			continue
		}
		pkg := packageOf(descs[i].name, moduleOf)
		if pkg == "" {
			continue
		}
		if perPkg[pkg] == nil {
			perPkg[pkg] = &sizes{}
		}
		perPkg[pkg][rodata] += size
		attributed += size
	}
	return attributed, nil
}

// readPackages reads "importpath module" lines.
func readPackages(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	moduleOf := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue
		}
		moduleOf[fields[0]] = fields[1]
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(moduleOf) == 0 {
		return nil, fmt.Errorf("%s: no packages", path)
	}
	return moduleOf, nil
}

// packageOf returns the listed package a symbol belongs to, or "" for none: the longest
// listed path that the name (less a "type:" or "go:itab." prefix and leading *, [] and the
// like) starts with, followed by a dot.
func packageOf(name string, moduleOf map[string]string) string {
	for _, prefix := range []string{"type:", "go:itab.", "go:link."} {
		name = strings.TrimPrefix(name, prefix)
	}
	name = strings.TrimPrefix(name, "noalg.")
	name = strings.TrimLeft(name, "*[]0123456789")
	name = strings.TrimPrefix(name, "map[")
	name = strings.TrimPrefix(name, "chan ")
	name = strings.TrimLeft(name, "*[]")
	if i := strings.IndexAny(name, "([,"); i >= 0 {
		name = name[:i]
	}
	best := ""
	for i := 0; i < len(name); i++ {
		if name[i] == '.' {
			if _, ok := moduleOf[name[:i]]; ok {
				best = name[:i]
			}
		}
	}
	return best
}

func sortedKeys(m map[string]*sizes, by func(sizes) int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := by(*m[keys[i]]), by(*m[keys[j]])
		if a != b {
			return a > b
		}
		return keys[i] < keys[j]
	})
	return keys
}

func mib(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20)) }
