//! `page` / `pageSize` of the OpenSandbox list routes (sandboxes, snapshots):
//! parsed the same way and cut the same way, so both answer the same
//! `pagination` object.
use crate::error::ApiError;
use ember_types::api::Pagination;
use ember_types::limits::MAX_PAGE_SIZE;

/// 1-based page and its size; defaults as upstream (page 1 of 20).
pub struct Paging {
    page: u32,
    page_size: u32,
}

impl Default for Paging {
    fn default() -> Self {
        Paging { page: 1, page_size: 20 }
    }
}

impl Paging {
    /// Takes `key=value` if it is a paging parameter; `Ok(false)` leaves it to the caller.
    pub fn accept(&mut self, key: &str, value: &str) -> Result<bool, ApiError> {
        match key {
            "page" => {
                self.page =
                    value.parse().ok().filter(|p| *p >= 1).ok_or_else(|| ApiError::bad_request("page must be >= 1"))?
            }
            "pageSize" => {
                self.page_size = value
                    .parse()
                    .ok()
                    .filter(|p| (1..=MAX_PAGE_SIZE).contains(p))
                    .ok_or_else(|| ApiError::bad_request(format!("pageSize must be 1..{MAX_PAGE_SIZE}")))?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// This page of `all`, each item converted by `info`, and its pagination.
    pub fn cut<T, U>(&self, all: &[T], info: impl Fn(&T) -> U) -> (Vec<U>, Pagination) {
        let total = all.len() as u64;
        let total_pages = total.div_ceil(u64::from(self.page_size)) as u32;
        let skip = (u64::from(self.page - 1) * u64::from(self.page_size)).min(total) as usize;
        let items = all.iter().skip(skip).take(self.page_size as usize).map(info).collect();
        let pagination = Pagination {
            page: self.page,
            page_size: self.page_size,
            total_items: total,
            total_pages,
            has_next_page: self.page < total_pages,
        };
        (items, pagination)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_cut_and_count() {
        let mut p = Paging::default();
        assert!(p.accept("page", "2").unwrap());
        assert!(p.accept("pageSize", "3").unwrap());
        assert!(!p.accept("state", "Running").unwrap());
        let (items, pg) = p.cut(&[1, 2, 3, 4, 5, 6, 7], |x| x * 10);
        assert_eq!(items, vec![40, 50, 60]);
        assert_eq!((pg.total_items, pg.total_pages, pg.has_next_page), (7, 3, true));
        let mut far = Paging::default();
        far.accept("page", "99").unwrap();
        assert!(far.cut(&[1], |x| *x).0.is_empty());
    }

    #[test]
    fn bad_values_are_refused() {
        let mut p = Paging::default();
        assert!(p.accept("page", "0").is_err());
        assert!(p.accept("pageSize", "201").is_err());
        assert!(p.accept("pageSize", "x").is_err());
    }
}
