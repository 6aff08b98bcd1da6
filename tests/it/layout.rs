//! The crate's shape, checked: files and functions short enough to read
//! whole, no two modules that import each other, and the HTTP side holding
//! no scheduling. `scripts/check-layout` runs these alone.
//!
//! The sources are read as text, not compiled: comments and literals are
//! blanked first (so a brace or a path in a string counts for nothing), and
//! each rule then reads the code that is left. Every failure names the file,
//! the line and the rule.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// No file of `src/` is longer, test modules written in it included.
const FILE_LINES: usize = 800;

/// No function outside the tests is longer, from its `fn` line to its
/// closing brace.
const FUNCTION_LINES: usize = 80;

/// What `src/serve/` must not import: the scheduling lives in the driver and
/// the engine, and the HTTP side only asks them.
const SCHEDULING: [&str; 4] = ["driver::timer", "engine::due", "fires", "schedule"];

/// A module path, `["engine", "due"]`; the crate root is empty.
type Module = Vec<String>;

/// One file of `src/`.
struct Source {
    /// Its path from the repository root, `src/engine/due.rs`.
    path: String,
    /// The library module it is, `None` for the binaries' own files.
    module: Option<Module>,
    /// Its text with comments and literals blanked, lines kept.
    code: Vec<char>,
    /// Where each line starts in `code`.
    line_starts: Vec<usize>,
    /// The `#[cfg(test)]` items written in it, as ranges of `code`.
    tests: Vec<(usize, usize)>,
    /// The inline modules written in it (`mod name { … }`), with their ranges.
    inline: Vec<(String, usize, usize)>,
}

impl Source {
    fn read(root: &Path, file: &Path) -> Source {
        let text = std::fs::read_to_string(file).unwrap();
        let path = file
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let code = blank_comments_and_literals(&text);
        let mut line_starts = vec![0];
        line_starts.extend(
            code.iter()
                .enumerate()
                .filter(|(_, c)| **c == '\n')
                .map(|(i, _)| i + 1),
        );
        let mut source = Source {
            module: module_of(&path),
            path,
            code,
            line_starts,
            tests: Vec::new(),
            inline: Vec::new(),
        };
        source.tests = source.test_items();
        source.inline = source.inline_modules();
        source
    }

    /// The 1-based line of a position of `code`.
    fn line(&self, at: usize) -> usize {
        self.line_starts.partition_point(|start| *start <= at)
    }

    fn lines(&self) -> usize {
        let last_empty = self.code.last() == Some(&'\n');
        self.line_starts.len() - usize::from(last_empty)
    }

    fn in_tests(&self, at: usize) -> bool {
        self.tests
            .iter()
            .any(|(start, end)| (*start..=*end).contains(&at))
    }

    /// Whether `word` stands at `at` as a whole word.
    fn word_at(&self, at: usize, word: &[char]) -> bool {
        let end = at + word.len();
        self.code.get(at..end) == Some(word)
            && !(at > 0 && is_ident(&self.code[at - 1]))
            && !self.code.get(end).is_some_and(is_ident)
    }

    /// The positions where `word` stands as a whole word.
    fn words(&self, word: &str) -> impl Iterator<Item = usize> + '_ {
        let word: Vec<char> = word.chars().collect();
        (0..self.code.len()).filter(move |at| self.word_at(*at, &word))
    }

    /// The identifier starting at `at` (after any blanks), with where it ends.
    fn ident(&self, at: usize) -> Option<(String, usize)> {
        let start = self.skip_blanks(at);
        let end = (start..self.code.len())
            .find(|i| !is_ident(&self.code[*i]))
            .unwrap_or(self.code.len());
        let first = self.code.get(start)?;
        (end > start && !first.is_ascii_digit())
            .then(|| (self.code[start..end].iter().collect(), end))
    }

    fn skip_blanks(&self, at: usize) -> usize {
        (at..self.code.len())
            .find(|i| !self.code[*i].is_whitespace())
            .unwrap_or(self.code.len())
    }

    /// Where the item starting at `at` opens its body (`{`) or ends without
    /// one (`;`), outside parentheses and brackets (`[u8; 32]`).
    fn body_or_end(&self, at: usize) -> Option<(usize, char)> {
        let mut depth = 0i32;
        for i in at..self.code.len() {
            match self.code[i] {
                '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                '{' | ';' if depth == 0 => return Some((i, self.code[i])),
                _ => {}
            }
        }
        None
    }

    /// The brace that closes the one opened at `open`.
    fn closing(&self, open: usize) -> usize {
        let mut depth = 0usize;
        for i in open..self.code.len() {
            match self.code[i] {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return i;
                    }
                }
                _ => {}
            }
        }
        panic!(
            "{}:{}: a brace that never closes",
            self.path,
            self.line(open)
        )
    }

    /// The items under `#[cfg(test)]`: from the attribute to the item's end.
    fn test_items(&self) -> Vec<(usize, usize)> {
        let attribute: Vec<char> = "#[cfg(test)]".chars().collect();
        let mut items = Vec::new();
        for at in 0..self.code.len() {
            if !self.code[at..].starts_with(&attribute) {
                continue;
            }
            let Some((end, found)) = self.body_or_end(at + attribute.len()) else {
                continue;
            };
            let end = if found == '{' { self.closing(end) } else { end };
            items.push((at, end));
        }
        items
    }

    /// The modules declared here with a body: `mod unique { … }`.
    fn inline_modules(&self) -> Vec<(String, usize, usize)> {
        self.words("mod")
            .filter_map(|at| {
                let (name, after) = self.ident(at + 3)?;
                let open = self.skip_blanks(after);
                (self.code.get(open) == Some(&'{')).then(|| (name, open, self.closing(open)))
            })
            .collect()
    }

    /// The modules declared here under `#[cfg(test)]` whose body is a file.
    fn test_module_files(&self) -> Vec<Module> {
        let Some(module) = &self.module else {
            return Vec::new();
        };
        self.tests
            .iter()
            .filter(|(_, end)| self.code[*end] == ';')
            .filter_map(|(start, end)| {
                let at = self.words("mod").find(|at| (start..end).contains(&at))?;
                let (name, _) = self.ident(at + 3)?;
                Some([module.clone(), vec![name]].concat())
            })
            .collect()
    }

    /// The module a position of the file is in: the file's own, and the
    /// inline modules around the position.
    fn module_at(&self, at: usize) -> Module {
        let mut module = self.module.clone().unwrap_or_default();
        module.extend(
            self.inline
                .iter()
                .filter(|(_, open, close)| (*open..=*close).contains(&at))
                .map(|(name, _, _)| name.clone()),
        );
        module
    }
}

fn is_ident(c: &char) -> bool {
    c.is_alphanumeric() || *c == '_'
}

/// The library module a file of `src/` is; `None` for `src/main.rs` and
/// `src/bin/`, which are crates of their own.
fn module_of(path: &str) -> Option<Module> {
    let inner = path.strip_prefix("src/")?.strip_suffix(".rs")?;
    if inner == "main" || inner.starts_with("bin/") {
        return None;
    }
    let mut module: Module = inner.split('/').map(str::to_owned).collect();
    if matches!(module.last().map(String::as_str), Some("lib" | "mod")) {
        module.pop();
    }
    Some(module)
}

/// `text` with every comment, string and character literal blanked to
/// spaces, its newlines kept, so positions keep their lines.
fn blank_comments_and_literals(text: &str) -> Vec<char> {
    let chars: Vec<char> = text.chars().collect();
    let mut code = chars.clone();
    let blank = |code: &mut Vec<char>, from: usize, to: usize| {
        for c in &mut code[from..to.min(chars.len())] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let mut i = 0;
    while i < chars.len() {
        let start = i;
        let after_ident = i > 0 && is_ident(&chars[i - 1]);
        i = match (at(i), at(i + 1)) {
            ('/', '/') => (i..chars.len())
                .find(|j| chars[*j] == '\n')
                .unwrap_or(chars.len()),
            ('/', '*') => block_comment_end(&chars, i),
            ('r', '"' | '#') | ('b', 'r') if !after_ident => match raw_string_end(&chars, i) {
                Some(end) => end,
                None => {
                    i += 1;
                    continue;
                }
            },
            ('"', _) => string_end(&chars, i + 1),
            ('\'', '\\') => (i + 3..chars.len())
                .find(|j| chars[*j] == '\'')
                .map_or(chars.len(), |j| j + 1),
            ('\'', _) if at(i + 2) == '\'' => i + 3,
            _ => {
                i += 1;
                continue;
            }
        };
        blank(&mut code, start, i);
    }
    code
}

/// Where the block comment opened at `open` ends, nested ones included.
fn block_comment_end(chars: &[char], open: usize) -> usize {
    let mut depth = 0;
    let mut i = open;
    while i + 1 < chars.len() {
        match (chars[i], chars[i + 1]) {
            ('/', '*') => {
                depth += 1;
                i += 2;
            }
            ('*', '/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    chars.len()
}

/// Where the string whose text starts at `from` ends, past its quote.
fn string_end(chars: &[char], from: usize) -> usize {
    let mut i = from;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    chars.len()
}

/// Where the raw string (`r"…"`, `r#"…"#`, `br"…"`) at `at` ends; `None`
/// when `at` starts no raw string (`r#type`, a plain `r`).
fn raw_string_end(chars: &[char], at: usize) -> Option<usize> {
    let mut i = at + if chars[at] == 'b' { 2 } else { 1 };
    let hashes = chars[i..].iter().take_while(|c| **c == '#').count();
    i += hashes;
    if chars.get(i) != Some(&'"') {
        return None;
    }
    let close: Vec<char> = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    let end = (i + 1..chars.len()).find(|j| chars[*j..].starts_with(&close))?;
    Some(end + close.len())
}

/// Every `.rs` file under `src/`, in path order.
fn sources() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    let mut dirs = vec![root.join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    assert!(
        files.len() > 10,
        "src/ has too few files: is the root right?"
    );
    files
        .iter()
        .map(|file: &PathBuf| Source::read(root, file))
        .collect()
}

/// The test files: a module whose body is a file of its own, declared under
/// `#[cfg(test)]` (`mod tests;`), and everything under it.
fn test_files(sources: &[Source]) -> BTreeSet<String> {
    let modules: Vec<Module> = sources.iter().flat_map(Source::test_module_files).collect();
    sources
        .iter()
        .filter(|source| {
            source
                .module
                .as_ref()
                .is_some_and(|m| modules.iter().any(|t| m.starts_with(t)))
        })
        .map(|source| source.path.clone())
        .collect()
}

fn report(rule: &str, failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "{} breach(es) of the rule \"{rule}\":\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn no_file_of_src_is_over_800_lines() {
    let failures = sources()
        .iter()
        .filter(|source| source.lines() > FILE_LINES)
        .map(|source| {
            format!(
                "{}:{}: the file has {} lines (rule: no file over {FILE_LINES} lines)",
                source.path,
                FILE_LINES + 1,
                source.lines()
            )
        })
        .collect();
    report("file length", failures);
}

#[test]
fn no_function_outside_the_tests_is_over_80_lines() {
    let sources = sources();
    let test_files = test_files(&sources);
    let mut failures = Vec::new();
    for source in sources
        .iter()
        .filter(|source| !test_files.contains(&source.path))
    {
        for at in source.words("fn").filter(|at| !source.in_tests(*at)) {
            // `fn(u32) -> u32` is a type, and `fn $name` a macro's pattern.
            let Some((name, after)) = source.ident(at + 2) else {
                continue;
            };
            let Some((open, '{')) = source.body_or_end(after) else {
                continue;
            };
            let (first, last) = (source.line(at), source.line(source.closing(open)));
            let lines = last - first + 1;
            if lines > FUNCTION_LINES {
                failures.push(format!(
                    "{}:{first}: fn {name} is {lines} lines (rule: no function outside the tests over {FUNCTION_LINES} lines)",
                    source.path
                ));
            }
        }
    }
    report("function length", failures);
}

/// The module each path of a file names, with the line it is named on:
/// `use crate::…`, `use super::…`, `use self::…` and a child's `use name::…`
/// (their braces expanded), and `crate::…`, `super::…` and `self::…` paths
/// written anywhere. A path names the deepest module it walks through, so
/// `crate::engine::due::Due` names `engine::due`. Test items are left out:
/// a test may reach for whatever it checks.
fn imports(source: &Source, modules: &BTreeSet<Module>) -> Vec<(Module, usize)> {
    let mut found = Vec::new();
    for at in source.words("use").filter(|at| !source.in_tests(*at)) {
        let Some(end) = (at..source.code.len()).find(|i| source.code[*i] == ';') else {
            continue;
        };
        let tree: String = source.code[at + 3..end].iter().collect();
        for path in expand_use_tree(&tree) {
            let here = source.module_at(at);
            if let Some(module) = resolve(&here, &path, modules, true) {
                found.push((module, source.line(at)));
            }
        }
    }
    for start in ["crate", "super", "self"] {
        for at in source.words(start).filter(|at| !source.in_tests(*at)) {
            let Some(path) = path_at(source, at) else {
                continue;
            };
            if let Some(module) = resolve(&source.module_at(at), &path, modules, false) {
                found.push((module, source.line(at)));
            }
        }
    }
    found
}

/// The path written at `at` (`crate::engine::due::Due`), if it goes on
/// with `::`.
fn path_at(source: &Source, at: usize) -> Option<Vec<String>> {
    let mut path = Vec::new();
    let mut i = at;
    loop {
        let (segment, end) = source.ident(i)?;
        path.push(segment);
        let next = source.skip_blanks(end);
        if source.code.get(next..next + 2) != Some(&[':', ':']) {
            break;
        }
        i = next + 2;
    }
    (path.len() > 1).then_some(path)
}

/// The paths a `use` tree names: `crate::engine::{due::Due, after}` is
/// `crate::engine::due::Due` and `crate::engine::after`; `self` in braces is
/// the path before them, a glob the module it reaches into.
fn expand_use_tree(tree: &str) -> Vec<Vec<String>> {
    let spaced: String = tree
        .chars()
        .flat_map(|c| match c {
            '{' | '}' | ',' | '*' => vec![' ', c, ' '],
            _ => vec![c],
        })
        .collect::<String>()
        .replace("::", " :: ");
    let tokens: Vec<&str> = spaced.split_whitespace().collect();
    let mut paths = Vec::new();
    use_tree(&tokens, &mut 0, &[], &mut paths);
    paths
}

/// Reads one tree of `tokens` from `*at`, under `prefix`, into `paths`.
fn use_tree(tokens: &[&str], at: &mut usize, prefix: &[String], paths: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    while let Some(token) = tokens.get(*at) {
        match *token {
            "::" | "pub" => *at += 1,
            "{" => {
                *at += 1;
                while tokens.get(*at).is_some_and(|t| *t != "}") {
                    use_tree(tokens, at, &path, paths);
                    if tokens.get(*at) == Some(&",") {
                        *at += 1;
                    }
                }
                *at += 1;
                return;
            }
            "*" => {
                *at += 1;
                break;
            }
            "as" => *at += 2,
            "," | "}" => break,
            "self" if !path.is_empty() => *at += 1,
            segment => {
                path.push(segment.to_owned());
                *at += 1;
            }
        }
    }
    paths.push(path);
}

/// The module `path`, written in `here`, names: the deepest module of
/// `modules` it walks into. `None` for a path outside the crate (`std::…`,
/// a dependency). A bare first segment names a child module only in a `use`.
fn resolve(
    here: &Module,
    path: &[String],
    modules: &BTreeSet<Module>,
    in_use: bool,
) -> Option<Module> {
    let mut current = match path.first()?.as_str() {
        "crate" | "$crate" => Vec::new(),
        "super" | "self" => here.clone(),
        child if in_use && modules.contains(&[here.clone(), vec![child.to_owned()]].concat()) => {
            here.clone()
        }
        _ => return None,
    };
    for segment in path {
        match segment.as_str() {
            "crate" | "self" => {}
            "super" => {
                current.pop();
            }
            name => {
                let deeper = [current.clone(), vec![name.to_owned()]].concat();
                if !modules.contains(&deeper) {
                    break;
                }
                current = deeper;
            }
        }
    }
    while !modules.contains(&current) {
        current.pop();
    }
    Some(current)
}

fn name(module: &Module) -> String {
    if module.is_empty() {
        "crate".to_owned()
    } else {
        module.join("::")
    }
}

/// The library's modules, each with its file and the modules it imports,
/// each import with the first line it is named on.
/// Test files are left out, as test items are.
fn import_graph(sources: &[Source]) -> BTreeMap<Module, (String, BTreeMap<Module, usize>)> {
    let modules: BTreeSet<Module> = sources.iter().filter_map(|s| s.module.clone()).collect();
    let test_files = test_files(sources);
    let mut graph = BTreeMap::new();
    for source in sources
        .iter()
        .filter(|source| !test_files.contains(&source.path))
    {
        let Some(module) = &source.module else {
            continue;
        };
        let mut imported = BTreeMap::new();
        for (target, line) in imports(source, &modules) {
            if &target != module {
                imported.entry(target).or_insert(line);
            }
        }
        graph.insert(module.clone(), (source.path.clone(), imported));
    }
    graph
}

/// Two modules that import each other. A module and its own submodules are
/// one piece (a parent re-exports its children, a child uses its parent's
/// types), so only modules neither of which is inside the other count.
#[test]
fn no_two_modules_import_each_other() {
    let graph = import_graph(&sources());
    let mut failures = Vec::new();
    for (module, (path, imported)) in &graph {
        for (target, line) in imported {
            if target.starts_with(module) || module.starts_with(target) || target < module {
                continue;
            }
            let Some((back_path, back)) = graph.get(target) else {
                continue;
            };
            if let Some(back_line) = back.get(module) {
                failures.push(format!(
                    "{path}:{line}: {} imports {}, which imports it back at {back_path}:{back_line} (rule: no two modules import each other)",
                    name(module),
                    name(target)
                ));
            }
        }
    }
    report("no circles", failures);
}

#[test]
fn serve_holds_no_scheduling() {
    let sources = sources();
    let graph = import_graph(&sources);
    let mut failures = Vec::new();
    for (module, (path, imported)) in graph
        .iter()
        .filter(|(module, _)| module.first().is_some_and(|m| m == "serve"))
    {
        for (target, line) in imported {
            if SCHEDULING
                .iter()
                .any(|s| target.starts_with(&s.split("::").map(str::to_owned).collect::<Vec<_>>()))
            {
                failures.push(format!(
                    "{path}:{line}: {} imports {}, which is scheduling (rule: src/serve/ holds no scheduling)",
                    name(module),
                    name(target)
                ));
            }
        }
    }
    report("serve holds no scheduling", failures);
}
