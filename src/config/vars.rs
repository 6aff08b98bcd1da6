//! `${NAME}` as a file reads it: strictly or leniently, each variable read
//! noted (its value is a secret), each unset one noted for a warning.

use std::cell::RefCell;

/// How `${NAME}` is looked up while a file is validated: strictly (an unset
/// name is an error), or leniently for commands that run no action (an
/// unset name reads as empty and is recorded for a warning).
pub(super) struct Vars<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    unset: Option<RefCell<Vec<String>>>,
    /// Every variable read and its value, in the order read: the
    /// scheduler's secrets.
    read: RefCell<Vec<(String, String)>>,
    /// Every unset variable read leniently, each time it was read.
    missed: RefCell<Vec<String>>,
}

impl<'a> Vars<'a> {
    pub(super) fn new(lookup: &'a dyn Fn(&str) -> Option<String>, lenient: bool) -> Vars<'a> {
        Vars {
            lookup,
            unset: lenient.then(RefCell::default),
            read: RefCell::default(),
            missed: RefCell::default(),
        }
    }

    /// The value of `name`, noted as read.
    fn read(&self, name: &str) -> Option<String> {
        let value = (self.lookup)(name)?;
        self.read
            .borrow_mut()
            .push((name.to_owned(), value.clone()));
        Some(value)
    }

    /// How many reads so far: a mark for [`Vars::names_since`] and
    /// [`Vars::missed_since`].
    pub(super) fn mark(&self) -> (usize, usize) {
        (self.read.borrow().len(), self.missed.borrow().len())
    }

    /// The names read since `mark`, each once.
    pub(super) fn names_since(&self, mark: (usize, usize)) -> Vec<String> {
        let mut names: Vec<String> = self.read.borrow()[mark.0..]
            .iter()
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The unset names read leniently since `mark`, each once.
    pub(super) fn missed_since(&self, mark: (usize, usize)) -> Vec<String> {
        let mut names: Vec<String> = self.missed.borrow()[mark.1..].to_vec();
        names.sort();
        names.dedup();
        names
    }

    /// Every variable read and its value.
    pub(super) fn read_all(&self) -> Vec<(String, String)> {
        self.read.borrow().clone()
    }

    /// Notes `value` as a secret read from the file itself (a token
    /// written in it).
    pub(super) fn note_secret(&self, value: &str) {
        self.read
            .borrow_mut()
            .push((String::new(), value.to_owned()));
    }

    /// The value of `name`; in lenient mode, empty (and recorded) if unset.
    pub(super) fn get(&self, name: &str) -> Option<String> {
        match (self.read(name), &self.unset) {
            (Some(value), _) => Some(value),
            (None, Some(unset)) => {
                self.missed.borrow_mut().push(name.to_owned());
                let mut unset = unset.borrow_mut();
                if !unset.iter().any(|n| n == name) {
                    unset.push(name.to_owned());
                }
                Some(String::new())
            }
            (None, None) => None,
        }
    }

    /// The value of `name`, unset being an error in either mode.
    pub(super) fn strict(&self, name: &str) -> Option<String> {
        self.read(name)
    }

    /// Whether an unset name reads as empty.
    pub(super) fn is_lenient(&self) -> bool {
        self.unset.is_some()
    }

    /// How many unset names were met so far.
    pub(super) fn unset_count(&self) -> usize {
        self.unset.as_ref().map_or(0, |u| u.borrow().len())
    }

    /// The unset names met, in the order first met.
    pub(super) fn unset(&self) -> Vec<String> {
        self.unset
            .as_ref()
            .map(|u| u.borrow().clone())
            .unwrap_or_default()
    }
}

/// The variables a validator reads `${NAME}` from.
pub(super) type Env<'a> = &'a Vars<'a>;
